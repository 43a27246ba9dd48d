"""The `gavel` command: every verb, `gavel up`, the daemons' settings and their config files.

`gavel.cli.main:main` is the console script. This package is the top of the house: it may
import every role (broker, worker, sim, bench) and nothing imports it.
"""
