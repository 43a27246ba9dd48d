"""`gavel submit --wait` on a system job: until an instance of its version runs, healthy, on
every node that could run it now (`ServiceStatus.waiting` empty).

Rules:
1. The nodes are the broker's: heard, healthy, not draining, carrying the job's labels
   (`gavel.broker.systems.job_nodes`); a node that joins while the command waits is waited
   for too, a node that leaves is not.
2. It ends without success (`Refused`, exit 3) when the job is stopped, when a node
   declines its instance (unschedulable, with the node's reason: it would wait for ever),
   when every node it waits for waits at the cluster cap (with the cap's refusal), or when
   `--timeout` passes first (default 30 s, as ``--wait=running``; 0: no limit).
3. Each event of the job (an instance made or stopped) is a reason to look again; it also
   looks every `gavel.client.jobwait.POLL_S`: the wait is the client's (`wait_system`).
"""

from __future__ import annotations

import argparse

from gavel.cli.outcomes import Refused
from gavel.cli.readouts import print_json
from gavel.client import Client, Ended, TimedOut

__all__ = ["wait_system"]


async def wait_system(client: Client, name: str, args: argparse.Namespace) -> int:
    """The client's own wait (`gavel.client.Client.wait_system`, rules 1 to 3), its ends said
    as this command says them."""
    limit = 30.0 if args.timeout is None else args.timeout or float("inf")
    try:
        st = await client.wait_system(name, None if limit == float("inf") else limit)
    except Ended as exc:  # stopped, or a node declined its instance: the sentence is said
        raise Refused(str(exc)) from None
    except TimedOut as exc:
        raise Refused(f"{name} not running on every node within {limit:g}s: "
                      f"waiting for {', '.join(exc.status.waiting)}") from None
    where = f": {', '.join(st.nodes)}" if st.nodes else ""
    print_json(st) if args.json else print(f"{st.name} running on {len(st.nodes)} nodes{where}")
    return 0
