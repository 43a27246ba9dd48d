"""``python -m gavel``: the `gavel` command, for a tree without the console script."""

import sys

from gavel.cli.main import main

sys.exit(main())
