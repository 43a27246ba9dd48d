"""``python -m gavel.cli``: the `gavel` command."""

import sys

from gavel.cli.main import main

sys.exit(main())
