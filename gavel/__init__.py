"""gavel: a decentralized bidding scheduler. Nodes bid over NATS, the broker awards the
lowest load and commits the placement to git.

One import namespace: the repository keeps its rooms as top-level folders (`shared/`,
`transport/`, `broker/`, `worker/`, `gateway/`, `client/`, `cli/`, `sim/`,
`bench/`) and this package
names each of them (``gavel.shared`` is ``shared/``, by a symbolic link), so nothing generic
like ``shared`` or ``worker`` lands in site-packages.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
