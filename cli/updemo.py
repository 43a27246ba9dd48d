"""`gavel up --demo`: a few workloads submitted, where each went and why printed, one of them
asked something through the gateway; the demo's workloads use the standard library only."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from gavel.cli.demoimage import IMAGE, container_spec
from gavel.client import BrokerRefused, Client
from gavel.shared.messages import Spec
from gavel.shared.reasons import render
from gavel.shared.records import RAISED
from gavel.shared.spec import Route
from gavel.shared.timing import Timing

__all__ = ["demo", "demo_specs"]

#: The demo's waits: machine waits of `Timing` (`shared.timing` rule 3).
_TIMING = Timing()


#: The demo's web workload: answers every GET with its instance and node, on its $PORT.
WEB = ("import http.server as h, os\n"
       "class H(h.BaseHTTPRequestHandler):\n"
       "    def do_GET(self):\n"
       "        b = ('hello from %s on %s\\n' % (os.environ['GAVEL_INSTANCE_ID'],"
       " os.environ['GAVEL_NODE_ID'])).encode()\n"
       "        self.send_response(200)\n"
       "        self.send_header('Content-Length', str(len(b)))\n"
       "        self.end_headers()\n"
       "        self.wfile.write(b)\n"
       "    def log_message(self, *args):\n"
       "        pass\n"
       "h.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), H).serve_forever()\n")


def any_user_python() -> str:
    """An interpreter any uid may run (the demo's workloads run as uids of their own,
    `worker.isolation`): this one if it and every directory to it are open to all, else
    python3 on the system's path. The demo's workloads use the standard library only."""
    real = Path(sys.executable).resolve()
    with contextlib.suppress(OSError):
        if all(p.stat().st_mode & 0o001 for p in (real, *real.parents)):
            return sys.executable
    return shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable


def demo_specs() -> list[Spec]:
    py = any_user_python()
    return [
        Spec(name="hello", command=[py, "-c", "print('hello from gavel')"], cpu=0.5,
             memory_mb=128),
        Spec(name="web", command=[py, "-c", WEB], cpu=1.0, memory_mb=512, ports=["http"],
             routes=[Route(path="/web", port="http")]),
        Spec(name="report-eu", command=[py, "-c", "print('eu batch done')"], cpu=1.0,
             memory_mb=256, labels={"zone": "b"}),
        Spec(name="big", command=[py, "-c", "print('big job done')"], cpu=6.0,
             memory_mb=4096),
        Spec(name="needs-gpu", command=[py, "-c", "print('never runs')"], cpu=1.0,
             labels={"gpu": "true"}),
    ]


def _get(url: str) -> tuple[int, str]:
    """One GET: its status and body (an HTTP error's too)."""
    try:
        with urllib.request.urlopen(url, timeout=_TIMING.ask_s) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


async def _through_gateway(url: str, timeout: float = _TIMING.demo_s) -> None:
    """The demo's request through the gateway, once the route to `web` is in place."""
    deadline = time.monotonic() + timeout
    status, body = 0, ""
    while time.monotonic() < deadline:
        try:
            status, body = await asyncio.to_thread(_get, url)
        except OSError as exc:
            status, body = 0, str(exc)
        if status == 200:
            break
        await asyncio.sleep(_TIMING.ask_pause_s)
    print("\nthrough the gateway (a Caddy routing /web to the web workload):")
    if status == 200:
        print(f"  GET {url} -> 200 {body.strip()}")
    else:
        print(f"  GET {url} got no answer from web within {timeout:g}s "
              f"({status or 'unreachable'} {body.strip()[:80]}); see logs/gateway.log")


async def demo(client: Client, workers: int, git_dir: Path, gateway: str | None = None) -> None:
    """The demo, asked of the cluster through the Python client as any program asks it."""
    nodes = await client.wait_nodes(workers)
    print(f"\n{len(nodes.nodes)} workers bidding:")
    for n in nodes.nodes:
        labels = ",".join(f"{k}={v}" for k, v in sorted(n.labels.items()))
        print(f"  {n.node_id:<8} {n.strategy:<13} {n.capacity.cpu:g} cpu "
              f"{n.capacity.memory_mb} MB  {labels}")
    ids = []
    refused = []  # the broker turns away what no node could ever hold (--workers 2: big)
    container, no_container = await asyncio.to_thread(container_spec)
    for spec in [*demo_specs(), *([container] if container else [])]:
        try:
            reply = await client.submit(spec)
        except BrokerRefused as exc:
            refused.append(f"  {spec.name:<18} refused: {exc}")
            continue
        ids.append(reply.instance_id)
    deadline = time.monotonic() + _TIMING.demo_s
    while time.monotonic() < deadline:
        st = await client.status()
        if all(i.state not in ("queued", "scheduled") for i in st.instances):
            break
        await asyncio.sleep(_TIMING.ask_pause_s)
    print("\nwhere each workload went, and why:")
    for iid in ids:
        why = await client.why(iid)
        a = why.auctions[0] if why.auctions else None
        if a is None:
            print(f"  {iid:<18} {why.instance.state}")
        elif a.winner:
            raised = a.raised()
            others = [f"{b.node_id} {b.load:.2f}" + (f" ({RAISED})" if b.node_id in raised
                                                     else "")
                      for b in a.bids if b.node_id != a.winner]
            declined = [f"{d.node_id}: {render(d.reason, d.detail)}" for d in a.declines]
            print(f"  {iid:<18} -> {a.winner} (lowest load {a.load:.2f}"
                  + (", tie broken on node id" if a.tie_broken else "") + ")"
                  + (f"; other bids: {', '.join(others)}" if others else "")
                  + (f"; declined: {'; '.join(declined)}" if declined else ""))
        else:
            print(f"  {iid:<18} unschedulable: {a.summary}")
    for line in refused:
        print(line)
    print(f"\na container: image {IMAGE}, placed as hello-container above" if container
          else f"\n{no_container}")
    if gateway is not None:
        await _through_gateway(f"{gateway}/web")
    await asyncio.sleep(_TIMING.demo_pause_s)
    evs = await client.events(limit=0)
    print("\nwhat the workers reported:")
    for e in evs.events:
        if e.type in ("running", "exited", "failed"):
            extra = f" exit {e.exit_code}" if e.exit_code is not None else ""
            print(f"  {e.instance_id:<18} {e.type:<8} on {e.node_id}{extra}")
    print(f"\nthe deployment is in git: git --git-dir {git_dir} log --stat")
