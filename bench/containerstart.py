"""Submit -> running of a process, a warm container and a cold one, side by side in one run:
``python -m gavel.bench.containerstart [--n 20] [--registry 127.0.0.1:PORT]`` prints one JSON
line per kind (p50, p99, mean, in ms) and needs a Docker Engine and Debian's static busybox.

Rules:
1. One nats-server, one broker and one worker with the engine, in this process; each kind is
   submitted `n` times in turn (process, warm, cold, process, ...), so load on the machine
   falls on all three alike. The clock runs from the submit request to the ``running`` event.
2. *Warm*: an image the node holds and has started before. *Cold*: an image built for that
   one submission and never started (its layers unpacked, no container made from it yet).
   *Pulled* (with ``--registry``, a registry the engine may push to and pull from, such as
   Debian's ``docker-registry`` on loopback): an image built for that one submission, pushed
   there and removed from the node, so the worker pulls it before it starts; its layers are
   a salt file and busybox (about 2 MB), so what it adds to cold is the pull's round trips
   and unpacking, not a network's bandwidth. Without ``--registry`` nothing is pulled.
3. Every job sleeps, and is cancelled once running; every image the run built is removed.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import nats

from gavel.broker.service import Broker, Config
from gavel.shared import subjects
from gavel.shared.api import CancelReply, CancelRequest, SubmitReply, SubmitRequest
from gavel.shared.messages import Event, Spec
from gavel.shared.strategies import make_strategy
from gavel.shared.timing import Timing
from gavel.transport.client import call
from gavel.transport.inbound import Decode, Malformed
from gavel.transport.natsserver import NatsServer
from gavel.worker.agent import Agent
from gavel.worker.engine import connect

__all__ = ["build_image", "main", "measure"]

#: The salt makes each cold image's top layer its own: nothing of it was started before.
_DOCKERFILE = (b'FROM scratch\nCOPY busybox /bin/busybox\nCOPY salt /salt\n'
               b'ENTRYPOINT ["/bin/busybox"]\n')
_PREFIX = "gavel-bench-start"
#: This run's own tags (``start-<pid>-...``): two runs on one engine never share an image.
_RUN = f"start-{os.getpid()}"


def build_image(client: Any, tag: str, salt: str) -> str:
    """An image of busybox and a `salt` file (rule 2), built on the node: its name."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("Dockerfile", _DOCKERFILE), ("salt", salt.encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        tar.add("/bin/busybox", arcname="busybox")
    buf.seek(0)
    name = f"{_PREFIX}:{tag}"
    client.images.build(fileobj=buf, custom_context=True, tag=name, rm=True)
    return name


def _pushed(client: Any, registry: str, i: int) -> str:
    """Rule 2's pulled image: built, pushed to `registry`, then gone from the node."""
    built = build_image(client, f"{_RUN}-pulled-{i}", f"pulled-{i}-{time.time()}")
    repo, tag = f"{registry}/{_PREFIX}", f"{_RUN}-pulled-{i}"
    client.images.get(built).tag(repo, tag)
    for line in client.images.push(repo, tag=tag, stream=True, decode=True):
        if "error" in line:
            raise SystemExit(f"cannot push to {registry}: {line['error']}")
    client.images.remove(built)
    client.images.remove(f"{repo}:{tag}")
    return f"{repo}:{tag}"


def _summary(kind: str, ms: list[float]) -> dict[str, Any]:
    ordered = sorted(ms)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"kind": kind, "n": len(ms), "p50_ms": round(statistics.median(ms), 1),
            "p99_ms": round(p99, 1), "mean_ms": round(statistics.fmean(ms), 1)}


async def measure(n: int, root: Path, registry: str = "",
                  timing: Timing | None = None) -> list[dict[str, Any]]:
    """Rule 1: each kind's submit -> running, `n` of each (`timing`: the production
    clocks unless given)."""
    import docker

    client = docker.from_env()
    server = NatsServer(store_dir=root / "js", log=root / "nats.log").start()
    timing = timing or Timing()
    broker = Broker(Config(nats_url=server.url, state_dir=root / "state", timing=timing))
    await broker.start()
    engine = connect("auto", node_id="bench", home=str(root / "worker"))
    if engine is None:
        raise SystemExit("no Docker Engine answers: start one (.ci/dockerd start)")
    agent = Agent(nats_url=server.url, node_id="bench", strategy=make_strategy("least-loaded"),
                  labels={}, state_dir=root / "worker", timing=timing, cpu=64,
                  memory_mb=65536, engine=engine)
    task = asyncio.create_task(agent.run())
    nc = await nats.connect(server.url)
    built: list[str] = []
    times: dict[str, list[float]] = {"process": [], "container-warm": [], "container-cold": []}
    if registry:
        times["container-pulled"] = []
    running: dict[str, asyncio.Future[float]] = {}
    decode: Decode[Event] = Decode(Event)

    async def on_event(msg: Any) -> None:
        event = decode(msg.data)
        if isinstance(event, Malformed):
            return
        fut = running.get(event.instance_id)
        if event.type == "running" and fut is not None and not fut.done():
            fut.set_result(time.perf_counter())

    try:
        await nc.subscribe(subjects.EVENTS_ALL, cb=on_event)
        await agent.ready.wait()
        warm = build_image(client, f"{_RUN}-warm", "warm")
        built.append(warm)
        for i in range(n + 1):  # the first round warms the warm image and is not counted
            cold = build_image(client, f"{_RUN}-cold-{i}", f"cold-{i}-{time.time()}")
            built.append(cold)
            kinds = [("process", Spec(name="p", command=["sleep", "60"], cpu=0.01)),
                     ("container-warm", Spec(name="w", image=warm, command=["sleep", "60"],
                                             cpu=0.01)),
                     ("container-cold", Spec(name="c", image=cold, command=["sleep", "60"],
                                             cpu=0.01))]
            if registry:
                pulled = _pushed(client, registry, i)
                built.append(pulled)
                kinds.append(("container-pulled", Spec(name="r", image=pulled,
                                                       command=["sleep", "60"], cpu=0.01)))
            for kind, spec in kinds:
                iid = f"{spec.name}-{i}"
                running[iid] = asyncio.get_running_loop().create_future()
                t0 = time.perf_counter()
                await call(nc, "submit", SubmitRequest(spec=spec, instance_id=iid),
                           SubmitReply, timeout=30)
                t1 = await asyncio.wait_for(running[iid], 60)
                if i:
                    times[kind].append((t1 - t0) * 1000)
                await call(nc, "cancel", CancelRequest(instance_id=iid), CancelReply,
                           timeout=30)
        return [_summary(kind, ms) for kind, ms in times.items()]
    finally:
        await nc.close()
        await agent.stop()
        await asyncio.gather(task, return_exceptions=True)
        await broker.close()
        engine.close()
        server.stop()
        for name in built:
            try:
                client.images.remove(name, force=True)
            except Exception as exc:
                print(f"could not remove {name}: {exc}", file=sys.stderr)
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gavel.bench.containerstart",
                                     description=__doc__.split("\n", 1)[0] if __doc__ else "")
    parser.add_argument("--n", type=int, default=20, help="submissions of each kind")
    parser.add_argument("--registry", default="",
                        help="HOST:PORT of a registry to push to and pull from: adds the "
                             "pulled kind (rule 2)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gavel-bench-start-") as tmp:
        for line in asyncio.run(measure(args.n, Path(tmp), args.registry)):
            print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
