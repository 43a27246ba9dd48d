"""NATS URLs: one server, or a cluster as a comma-separated list.

Rule: ``--nats`` (``GAVEL_NATS_URL``, ``nats`` in a config file) may name several servers
of one cluster, ``nats://a:4222,nats://b:4222``; every connection gavel makes is given
them all as nats-py's server list, tries them in turn, and reconnects to whichever is up
(the servers' own gossip adds the rest of the cluster).
"""

from __future__ import annotations

__all__ = ["servers"]


def servers(url: str) -> list[str]:
    """The URL list `url` names (one entry for one server)."""
    return [u.strip() for u in url.split(",") if u.strip()] or [url]
