"""Chaos with several brokers (`make chaos-ha`): the `gavel up --ha` shape
(`bench.chaoshacluster`) under a steady stream of submissions while the leading broker is
killed with -9 again and again, standbys are killed, nats-servers are killed and restarted
one at a time and workers are killed; then, once it settles, every submitted instance is
checked placed exactly once on the remote every broker pushes to - what is durable - and
alive only where placed (`bench.chaoscheck`).

Rules:
1. The plan comes from the seed (`chaosplan.ha_schedule`); whom a broker fault hits is
   decided when it lands: a leader kill kills whoever the API names as leader then, a
   standby kill a broker that runs and does not lead, a nats-server kill the next of the
   three in turn. A leader kill whose target is not there (no leader answers in time) is
   skipped and not counted; a standby kill waits for a leader with a standby running
   beside it, and is an error if none comes in time - never a silent skip.
2. A leader kill ends when a newer leadership (a higher epoch) answers; the killed broker
   is restarted after its hold, and may be the one that takes the lease again. A
   nats-server's kill ends when the API answers again with it back. So at most one broker
   or one server is down at once (`chaosplan` rule 5).
3. Failovers are counted from the remote's history: each leadership's first commit names
   its epoch, so a run's failovers are its leaderships less the first. Fewer than the plan's
   leader kills (or any kind fewer than its minimum) is an error, as is a permissions
   violation in any server's log, a process that died by itself, or any invariant broken.
4. The plan's minimums are injected even when earlier faults (each waits for a takeover or a
   leader) push them past the run's duration (`chaosplan.due`, its rule 6); the extras are
   dropped. Submissions still stop at the duration.

``python -m gavel.bench.chaosha [--duration S] [--workers N] [--seed N] [--leader-kills N]
[--json]``: progress on stderr, the JSON summary as the last line of stdout, exit 0 only
when every check holds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gavel.bench.chaoscheck import held_by
from gavel.bench.chaoscluster import Fleet
from gavel.bench.chaosdrive import Drive, broken, finish, options, report, say, until
from gavel.bench.chaoshacluster import SERVERS, TTL_S, HaCluster
from gavel.bench.chaosplan import (
    HA_DURATION,
    HA_KINDS,
    TIMING,
    Fault,
    due,
    ha_minimums,
    ha_schedule,
    node_ids,
    room,
    submissions,
)
from gavel.bench.interrupt import stopped_by_signals, whole
from gavel.shared.api import NodesReply, NodesRequest
from gavel.transport.client import call, connect

__all__ = ["HaChaos", "HaOptions", "main", "run"]

#: How long a fault waits for a leader to answer (rule 1, 2): several lease TTLs.
_LEADER_WAIT_S = 10 * TTL_S
_EPOCH_COMMIT = "gavel: broker "


@dataclass
class HaOptions:
    duration: float = HA_DURATION
    workers: int = 3
    seed: int = 1
    state: Path | None = None
    settle_s: float = 90.0
    keep: bool = False
    #: At least this many leader kills (default: the plan's minimum for the duration).
    leader_kills: int | None = None


class HaChaos(Drive):
    def __init__(self, opts: HaOptions, root: Path, cluster: HaCluster, nc: Any) -> None:
        super().__init__(root=root, repo_path=cluster.remote, nc=nc, settle_s=opts.settle_s,
                         revive=cluster.revive)
        self.opts = opts
        self.cluster = cluster
        self.least = ha_minimums(opts.duration)
        if opts.leader_kills is not None:
            self.least["leader_kill"] = opts.leader_kills
        #: Leader changes seen by the API after a leader kill (rule 2).
        self.takeovers = 0
        self._servers_killed = 0

    async def drive(self) -> None:
        o = self.opts
        faults = ha_schedule(o.seed, o.duration, self.cluster.nodes, least=self.least)
        self.say(f"seed {o.seed}: {len(faults)} faults ({dict(Counter(f.kind for f in faults))}"
                 f", at least {self.least})")
        self.started = t0 = time.monotonic()
        watcher = asyncio.ensure_future(self.watch_heads())
        stream = asyncio.ensure_future(self.stream(submissions(o.seed, o.duration), t0))
        progress = asyncio.ensure_future(self.progress())
        lanes = [asyncio.ensure_future(self._lane([f for f in faults if (f.kind == "worker_kill")
                                                   == kill], t0)) for kill in (False, True)]
        try:
            await asyncio.gather(*lanes)
            await until(t0 + o.duration)
            await stream
            self.say(f"faults done: {dict(self.seen.faults)}; settling "
                     f"(at most {o.settle_s:g}s)")
            self.verdict = await self.settle()
        finally:
            rest = [watcher, stream, progress, *lanes, *self.pending()]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

    async def _lane(self, faults: list[Fault], t0: float) -> None:
        """Each fault in turn; past the run's duration only those the minimums still need
        (rule 4)."""
        for f in faults:
            await until(t0 + f.at)
            if not due(f.kind, time.monotonic() > t0 + self.opts.duration, self.seen.faults,
                       self.least):
                continue
            await self._inject(f)
            self.cluster.revive()

    # -- who leads -------------------------------------------------------------------------
    async def leader(self, after: int = 0, wait_s: float = _LEADER_WAIT_S) -> tuple[str, int]:
        """The broker the API names as leader and its epoch, once that epoch is above
        `after` (("", 0) if none in `wait_s`)."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                reply = await call(self.nc, "nodes", NodesRequest(), NodesReply, timeout=2.0)
                if reply.leader and reply.epoch > after:
                    return reply.leader, reply.epoch
            except Exception:
                pass
            await asyncio.sleep(0.2)
        return "", 0

    async def _standbys(self) -> tuple[str, list[str]]:
        """The leader and the brokers that run beside it, once there is at least one (rule
        1: a standby kill waits for one); ("", []) if none in `_LEADER_WAIT_S`."""
        deadline = time.monotonic() + _LEADER_WAIT_S
        while True:
            leader, _ = await self.leader(wait_s=max(0.0, deadline - time.monotonic()))
            standbys = [n for n in self.cluster.running_brokers() if n != leader]
            if leader and standbys:
                return leader, standbys
            if time.monotonic() >= deadline:
                return "", []
            self.cluster.revive()
            await asyncio.sleep(0.2)

    # -- faults (rules 1, 2) ---------------------------------------------------------------
    async def _inject(self, f: Fault) -> None:
        c = self.cluster
        if f.kind == "leader_kill":
            leader, epoch = await self.leader()
            if not leader or leader not in c.running_brokers():
                self.say("leader_kill: no leader answered; skipped")
                return
            self.seen.faults[f.kind] += 1
            self.say(f"leader_kill: kill -9 {leader} (epoch {epoch}), restart in {f.hold:.1f}s")
            c.kill_broker(leader)
            await asyncio.sleep(f.hold)
            c.start_broker(leader)
            after, newer = await self.leader(after=epoch)
            if after:
                self.takeovers += 1
                self.say(f"leader_kill: {after} leads (epoch {newer})")
            else:
                self.seen.errors.append(f"no broker took over from {leader} within "
                                        f"{_LEADER_WAIT_S:g}s")
        elif f.kind == "standby_kill":
            leader, standbys = await self._standbys()
            if not standbys:
                self.seen.errors.append(f"standby_kill: no leader with a running standby "
                                        f"answered within {_LEADER_WAIT_S:g}s")
                return
            victim = standbys[self.seen.faults[f.kind] % len(standbys)]
            self.seen.faults[f.kind] += 1
            self.say(f"standby_kill: kill -9 {victim} ({leader} leads), restart in "
                     f"{f.hold:.1f}s")
            c.kill_broker(victim)
            await asyncio.sleep(f.hold)
            c.start_broker(victim)
        elif f.kind == "nats_restart":
            i = self._servers_killed % SERVERS
            self._servers_killed += 1
            self.seen.faults[f.kind] += 1
            self.say(f"nats_restart: kill -9 nats-server {i + 1}, down for {f.hold:.1f}s")
            await asyncio.to_thread(c.kill_server, i)
            await asyncio.sleep(f.hold)
            await whole(lambda: c.start_server(i))
            if not (await self.leader())[0]:
                self.seen.errors.append(f"no leader answered within {_LEADER_WAIT_S:g}s of "
                                        f"nats-server {i + 1}'s restart")
        else:
            await self._kill_worker(f)

    async def _kill_worker(self, f: Fault) -> None:
        c = self.cluster
        node = _target(c, f.node)
        if c.workers[node] is None:
            return
        self.seen.faults[f.kind] += 1
        held = held_by(self.root / "workers" / node)
        self.say(f"worker_kill: kill -9 {node} ({len(held)} instances), restart in "
                 f"{f.hold:.1f}s")
        c.kill_worker(node)
        await asyncio.sleep(f.hold)
        c.start_worker(node)

    # -- the summary (rule 3) ----------------------------------------------------------------
    def epochs(self) -> list[str]:
        """Each leadership's first commit on the remote, oldest first."""
        _heads, final = self.heads()
        if final is None:
            return []
        return [c.message.splitlines()[0] for c in self.repo.walk(final)
                if c.message.startswith(_EPOCH_COMMIT)][::-1]

    def summary(self, duration_s: float) -> dict[str, Any]:
        seen = self.seen
        errors = [*seen.errors, *self.cluster.crashes]
        counts = self.counts(errors)
        leaderships = self.epochs()
        failovers = max(0, len(leaderships) - 1)
        for kind, least in self.least.items():
            if seen.faults[kind] < least:
                errors.append(f"{kind}: {seen.faults[kind]} injected, the plan's minimum is "
                              f"{least}")
        if failovers < self.least["leader_kill"]:
            errors.append(f"{failovers} failovers on the remote, fewer than the "
                          f"{self.least['leader_kill']} leader kills planned")
        violations = self.cluster.violations()
        if violations:
            errors.append(f"nats-servers logged {violations} permissions violations")
        return {
            **counts,
            "failovers": failovers,
            "takeovers_seen": self.takeovers,
            "faults": {k: seen.faults[k] for k in HA_KINDS},
            "minimums": dict(self.least),
            "ok": not errors,
            "clean": not errors and not self.verdict.ended_lost,
            "duration_s": round(duration_s, 1),
            "brokers": len(self.cluster.brokers),
            "servers": SERVERS,
            "auth": {"nodes": len(self.cluster.ids.nodes), "violations": violations},
            "seed": self.opts.seed,
            "errors": errors[:20],
        }


def _target(c: Fleet, seeded: str) -> str:
    """The seeded node if it runs something, else the node running the most."""
    up = [n for n in c.nodes if c.workers[n] is not None] or list(c.nodes)
    counts = {n: len(held_by(c.root / "workers" / n)) for n in up}
    if counts.get(seeded):
        return seeded
    return max(up, key=lambda n: (counts[n], n == seeded))


async def run(opts: HaOptions) -> dict[str, Any]:
    """One HA chaos run; the summary (``ok`` says whether every check held)."""
    began = time.monotonic()
    root = (opts.state or Path(tempfile.mkdtemp(prefix="gavel-chaos-ha-"))).resolve()
    root.mkdir(parents=True, exist_ok=True)
    cluster = HaCluster(root, node_ids(opts.workers),
                        room(submissions(opts.seed, opts.duration), opts.workers))
    say(f"state and logs under {root}")
    nc: Any = None
    try:
        await whole(cluster.start)
        nc = await connect(cluster.url, cluster.operator_creds, allow_reconnect=True,
                           max_reconnect_attempts=-1, reconnect_time_wait=0.25)
        chaos = HaChaos(opts, root, cluster, nc)
        await _ready(chaos, opts.workers)
        await chaos.drive()
        summary = await asyncio.to_thread(chaos.summary, time.monotonic() - began)
    finally:  # the one way out (`bench.interrupt`)
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.close()
        cluster.stop()  # blocking: a second signal cannot cut it short
    finish(summary, root, opts.state, opts.keep)
    return summary


async def _ready(chaos: HaChaos, workers: int, timeout: float = 120.0) -> None:
    """Until a leader answers and counts every worker healthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            reply = await call(chaos.nc, "nodes", NodesRequest(), NodesReply, timeout=2.0)
            if reply.leader and sum(n.health == "healthy" for n in reply.nodes) >= workers:
                say(f"{reply.leader} leads (epoch {reply.epoch}); {workers} workers healthy")
                return
        except Exception:
            pass
        await asyncio.sleep(TIMING.heartbeat_s / 4)
    raise TimeoutError(f"no leader counted {workers} healthy workers within {timeout:g}s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gavel.bench.chaosha", description=__doc__.split(
        "\n\n")[0] if __doc__ else None)
    p.add_argument("--duration", type=float, default=HA_DURATION, metavar="S",
                   help="seconds of faults and submissions (default %(default)g)")
    options(p, workers=3, settle_s=90.0)
    p.add_argument("--leader-kills", type=int, default=None, metavar="N",
                   help="at least this many leader kills (default: the plan's for the "
                        "duration)")
    args = p.parse_args(argv)
    if args.duration <= 0 or args.workers < 2:
        p.error("--duration must be positive and --workers at least 2")
    try:
        summary = asyncio.run(stopped_by_signals(run(HaOptions(
            duration=args.duration, workers=args.workers, seed=args.seed, state=args.state,
            settle_s=args.settle, keep=args.keep, leader_kills=args.leader_kills))))
    except (Exception, KeyboardInterrupt) as exc:  # the run itself broke: still a summary
        summary = broken(exc, args.seed, dict.fromkeys(HA_KINDS, 0), failovers=0,
                         duration_s=0)
    return report(summary, f"chaos-ha, seed {summary['seed']}: {summary['submitted']} "
                  f"submitted, {summary['placed_once']} placed once, {summary['terminal']} "
                  f"terminal, {summary['lost']} lost, {summary['duplicated']} duplicated; "
                  f"{summary['failovers']} failovers; faults {summary['faults']}; "
                  f"{summary['duration_s']}s", args.json)


if __name__ == "__main__":
    sys.exit(main())
