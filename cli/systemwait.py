"""`gavel submit --wait` on a system job: until an instance of its version runs, healthy, on
every node that could run it now (`ServiceStatus.waiting` empty).

Rules:
1. The nodes are the broker's: heard, healthy, not draining, carrying the job's labels
   (`gavel.broker.systems.job_nodes`); a node that joins while the command waits is waited
   for too, a node that leaves is not.
2. It ends without success (`Refused`, exit 3) when the job is stopped, when a node
   declines its instance (unschedulable, with the node's reason: it would wait for ever),
   or when `--timeout` passes first (default 30 s, as ``--wait=running``; 0: no limit).
3. Each event of the job (an instance made or stopped) is a reason to look again; it also
   looks every `POLL_S`.
"""

from __future__ import annotations

import argparse
import contextlib
import time

from gavel.cli.outcomes import Refused
from gavel.cli.readouts import print_json
from gavel.client import Client
from gavel.shared import subjects
from gavel.shared.api import ServiceStatus

__all__ = ["POLL_S", "wait_system"]

#: How often it asks how the job stands, besides each event it hears (rule 3).
POLL_S = 0.5


async def wait_system(client: Client, name: str, args: argparse.Namespace) -> int:
    limit = 30.0 if args.timeout is None else args.timeout or float("inf")
    deadline = time.monotonic() + limit
    sub = await client.nc.subscribe(subjects.EVENTS.format(instance=name))
    try:
        while True:
            st = (await client.service(name)).service
            done, line = judged(st)
            if done:
                print_json(st) if args.json else print(line)
                return 0
            if time.monotonic() >= deadline:
                raise Refused(f"{name} not running on every node within {limit:g}s: "
                              f"waiting for {', '.join(st.waiting)}")
            with contextlib.suppress(Exception):
                await sub.next_msg(timeout=POLL_S)
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


def judged(st: ServiceStatus) -> tuple[bool, str]:
    """Whether the wait is over with success, and the sentence that says so; `Refused`
    when it is over without (rule 2)."""
    if st.stopped:
        raise Refused(f"{st.name} was stopped")
    for r in st.replicas:
        if r.version == st.version and r.state == "unschedulable":
            raise Refused(f"{st.name}: {r.instance_id} is unschedulable: "
                          f"{r.detail or r.reason}")
    if st.waiting:
        return False, ""
    where = f": {', '.join(st.nodes)}" if st.nodes else ""
    return True, f"{st.name} running on {len(st.nodes)} nodes{where}"
