"""Chaos: a real cluster under a steady stream of submissions while faults are injected; once
the faults stop and the cluster settles, the invariants are checked from the outside. By
default (`make chaos`) at full size: `chaosplan.FULL` faults at least in `chaosplan.DURATION`
seconds, every part on its own NATS identity.

Rules:
1. Every fault, pause, submission and foreign commit comes from the seed (`schedule`,
   `submissions`, `foreign_times`): the same seed injects the same faults in the same order
   with the same pauses. When they land depends on the machine; what is checked does not.
2. The faults: kill -9 of the broker's process group (broker and git writer) restarted after
   a pause; a nats-server restart on the same port and JetStream store; kill -9 of a worker
   restarted on the same state dir after a pause (it re-adopts its children); a worker frozen
   with SIGSTOP past the offline threshold, then SIGCONT (it must stop what was moved away);
   a commit by someone else on the state branch (`bench.chaoscheck.foreign_commit`).
3. Submissions, their retries and settling are `bench.chaosdrive`'s, read from the broker's
   own state repository.
4. The checks (`bench.chaoscheck`) are invariants, never timings: every instance placed in
   exactly one node.json or honestly terminal; none alive on two nodes; every foreign commit
   in the final history with its file intact; the heads observed over time form a chain.
5. The summary's ``lost`` counts submitted work that is neither placed nor honestly ended
   (gavel lost it); instances the broker itself ended `lost` are counted on their own
   (``ended_lost``), apart from the other terminal states: an honest outcome, which keeps
   ``ok`` but not ``clean``. Work still unschedulable for want of room is counted on its own
   too (``unschedulable``), never as lost.
6. What the plan schedules is checked as reached: fewer faults of a kind than its minimum,
   fewer freezes whose node rejoined after its instances were re-placed and stopped its
   copies (``rejoined_after_move``) than freezes scheduled, or any permissions violation
   in nats-server's log (``auth.violations``) is an error.

``python -m gavel.bench.chaos [--duration S] [--workers N] [--seed N] [--json]``: progress
on stderr, the JSON summary as the last line of stdout, exit 0 only when every check holds.
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

from gavel.bench.chaoscheck import alive_by_node, foreign_commit, held_by
from gavel.bench.chaoscluster import Cluster
from gavel.bench.chaosdrive import (
    Drive,
    broken,
    count_in,
    finish,
    options,
    report,
    say,
    until,
)
from gavel.bench.chaosplan import (
    DURATION,
    FAULTS,
    KILL_LANE,
    KINDS,
    TIMING,
    Fault,
    Submission,
    foreign_times,
    minimums,
    node_ids,
    room,
    schedule,
    submissions,
)
from gavel.bench.interrupt import stopped_by_signals, whole
from gavel.broker.ledger.repository import Ledger
from gavel.shared.api import NodesReply, NodesRequest
from gavel.transport.client import call, connect, wait_healthy

__all__ = ["KINDS", "Fault", "Options", "Submission", "foreign_times", "main", "run",
           "schedule", "submissions"]



@dataclass
class Options:
    duration: float = DURATION
    workers: int = 4
    seed: int = 1
    state: Path | None = None
    settle_s: float = 60.0
    keep: bool = False
    overlap: bool = False


@dataclass
class Freeze:
    node: str
    moved: list[str]
    offline_seen: bool | None
    #: Of `moved`, how many git had placed on another node at the thaw.
    replaced: int = 0
    #: The thawed node stopped every copy of what was moved away while it was frozen.
    stopped: bool = False
    #: The broker counted it healthy again after the thaw.
    rejoined: bool = False


class Chaos(Drive):
    def __init__(self, opts: Options, root: Path, cluster: Cluster, nc: Any) -> None:
        super().__init__(root=root, repo_path=root / "state.git", nc=nc,
                         settle_s=opts.settle_s, revive=cluster.revive)
        self.opts = opts
        self.cluster = cluster
        #: What the plan injects at least, by kind (set by `drive`; rule 6).
        self.least: dict[str, int] = {}
        self.freezes: list[Freeze] = []
        self._nats = asyncio.Lock()  # two overlapping restarts must not start two servers

    # -- the run ---------------------------------------------------------------------------
    async def drive(self) -> None:
        o = self.opts
        nodes = self.cluster.nodes
        self.least = minimums(o.duration)
        faults = schedule(o.seed, o.duration, nodes, overlap=o.overlap, least=self.least)
        self.say(f"seed {o.seed}: {len(faults)} faults ({dict(Counter(f.kind for f in faults))}"
                 f", at least {self.least}): "
                 + ", ".join(f"{f.kind}{'(' + f.node + ')' if f.node else ''}@{f.at:g}s"
                             for f in faults))
        self.started = t0 = time.monotonic()
        watcher = asyncio.ensure_future(self.watch_heads())
        stream = asyncio.ensure_future(self.stream(submissions(o.seed, o.duration), t0))
        notes = asyncio.ensure_future(self._foreign(foreign_times(o.seed, o.duration), t0))
        progress = asyncio.ensure_future(self.progress())
        lanes = [asyncio.ensure_future(self._lane([f for f in faults if (f.kind in KILL_LANE)
                                                   == kill], t0)) for kill in (False, True)]
        try:
            await asyncio.gather(*lanes)
            await until(t0 + o.duration)
            while self._faults:  # every overlapping fault has restarted what it stopped
                await asyncio.wait(set(self._faults))
            await stream
            self.stop_at = time.monotonic() + o.settle_s
            await notes
            self.say(f"faults done: {dict(self.seen.faults)}; settling "
                     f"(at most {o.settle_s:g}s)")
            self.verdict = await self.settle()
        finally:
            rest = [watcher, stream, notes, progress, *lanes, *self.pending()]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

    async def _lane(self, faults: list[Fault], t0: float) -> None:
        """One lane of the plan (`chaosplan` rule 2): each fault in turn, or each started at
        its time when they may overlap."""
        for f in faults:
            await until(t0 + f.at)
            if self.opts.overlap:
                self.spawn(self._faults, self._inject(f))
            else:
                await self._inject(f)
                self.cluster.revive()

    # -- faults ----------------------------------------------------------------------------
    async def _foreign(self, times: list[float], t0: float) -> None:
        for n, at in enumerate(times, 1):
            await until(t0 + at)
            got = await asyncio.to_thread(foreign_commit, self.repo_path, n)
            if got is None:
                self.seen.errors.append(f"could not land foreign commit {n}: the ref stayed "
                                        "locked or kept moving")
                continue
            self.seen.foreign.append(got)
            self.seen.faults["foreign_commit"] += 1
            self.say(f"foreign_commit: {got.path} as {got.sha[:12]}")

    async def _inject(self, f: Fault) -> None:
        """One fault, and the restart or thaw that ends it. With overlapping faults, one that
        finds its target already down or frozen is skipped (and not counted)."""
        c = self.cluster
        if f.kind == "broker_kill":
            if c.broker is None:
                return
            self.seen.faults[f.kind] += 1
            self.say(f"broker_kill: kill -9, restart in {f.hold:.1f}s")
            c.kill_broker()
            await asyncio.sleep(f.hold)
            c.start_broker()
        elif f.kind == "nats_restart":
            if self._nats.locked():
                return
            async with self._nats:
                self.seen.faults[f.kind] += 1
                self.say(f"nats_restart: down for {f.hold:.1f}s")
                await asyncio.to_thread(c.nats.stop)
                await asyncio.sleep(f.hold)
                await whole(c.nats.start)
        elif f.kind == "worker_kill":
            node = self._target(f.node)
            if c.workers[node] is None or node in c.frozen:
                return
            self.seen.faults[f.kind] += 1
            held = held_by(self.root / "workers" / node)
            self.say(f"worker_kill: kill -9 {node} ({len(held)} instances), restart in "
                     f"{f.hold:.1f}s")
            c.kill_worker(node)
            await asyncio.sleep(f.hold)
            c.start_worker(node)
        else:
            await self._freeze(f)

    async def _freeze(self, f: Fault) -> None:
        """SIGSTOP past the offline threshold; at SIGCONT, what the node holds but git has
        moved away must stop — the worker learns it from its node.json in KV. The node
        frozen is one the broker counts healthy and that runs something (waited for a few
        heartbeats: a broker just restarted may not know every node yet), and it stays
        frozen past its planned hold until what it runs has been re-placed (bounded), so
        each freeze tests a move and the rejoin after it."""
        c = self.cluster
        node = await self._freeze_target(f.node)
        if c.workers[node] is None or node in c.frozen:
            return
        self.seen.faults[f.kind] += 1
        self.say(f"worker_freeze: SIGSTOP {node} for {f.hold:.1f}s")
        c.freeze(node)
        held = held_by(self.root / "workers" / node)
        await asyncio.sleep(max(0.0, f.hold - TIMING.heartbeat_s))
        deadline = time.monotonic() + TIMING.offline_s
        while held and time.monotonic() < deadline:
            where = self.ledger.state().where
            if all(where.get(i) != node for i in held):
                break
            await asyncio.sleep(0.25)
        offline = await self._health(node)
        await asyncio.sleep(min(f.hold, TIMING.heartbeat_s))
        held = held_by(self.root / "workers" / node)
        where = self.ledger.state().where
        moved = sorted(i for i in held if where.get(i) != node)
        c.thaw(node)
        self.say(f"worker_freeze: SIGCONT {node}; broker saw it "
                 f"{'offline' if offline else 'not offline' if offline is False else '(?)'}"
                 f"; {len(moved)}/{len(held)} of its instances were moved away")
        freeze = Freeze(node, moved, offline,
                        replaced=sum(where.get(i) not in (None, node) for i in moved))
        self.freezes.append(freeze)
        self.spawn(self._tasks, self._watch_fencing(freeze))

    async def _freeze_target(self, seeded: str) -> str:
        """The node running the most that the broker counts healthy, waited for at most a
        few heartbeats; else `_target`'s pick."""
        c = self.cluster
        deadline = time.monotonic() + 5 * TIMING.heartbeat_s
        while time.monotonic() < deadline:
            try:
                reply = await call(self.nc, "nodes", NodesRequest(), NodesReply, timeout=2.0)
                healthy = {n.node_id for n in reply.nodes if n.health == "healthy"}
            except Exception:
                healthy = set()
            runs = {n: len(held_by(self.root / "workers" / n)) for n in c.nodes
                    if n in healthy and c.workers[n] is not None and n not in c.frozen}
            if any(runs.values()):
                return max(runs, key=lambda n: (runs[n], n == seeded))
            await asyncio.sleep(0.25)
        return self._target(seeded, most=True)

    def _target(self, seeded: str, most: bool = False) -> str:
        """The seeded node if it runs something (its agent.json; unless `most`: a freeze),
        else the node running the most (ties: the nodes after the seeded one first), so a kill has
        something to re-adopt and a freeze the most to move away and stop. A node the other
        lane holds (frozen, or down) is never the target while another is free
        (`chaosplan` rule 2)."""
        c = self.cluster
        nodes = c.nodes
        k = nodes.index(seeded)
        order = [n for n in nodes[k:] + nodes[:k]
                 if c.workers[n] is not None and n not in c.frozen] or nodes[k:] + nodes[:k]
        counts = {n: len(held_by(self.root / "workers" / n)) for n in order}
        if counts.get(seeded) and not most:
            return seeded
        return max(order, key=lambda n: (counts[n], -order.index(n)))

    async def _health(self, node: str, health: str = "offline") -> bool | None:
        """Whether the broker counts `node` as `health` (None: it did not answer)."""
        try:
            reply = await call(self.nc, "nodes", NodesRequest(), NodesReply, timeout=2.0)
        except Exception:
            return None
        return any(n.node_id == node and n.health == health for n in reply.nodes)

    async def _watch_fencing(self, fr: Freeze) -> None:
        """When the thawed node has stopped what was moved away, and when the broker counts
        it healthy again (`rejoined_after_move`; the final check of the copies is in
        `summary`)."""
        thawed = time.monotonic()
        node, moved = fr.node, fr.moved
        while moved and not fr.stopped:
            alive = await asyncio.to_thread(alive_by_node, self.root / "workers")
            where = self.ledger.state().where
            left = [i for i in moved if node in alive.get(i, ()) and where.get(i) != node]
            if not left:
                fr.stopped = True
                self.say(f"{node} stopped the {len(moved)} instances moved away while it was "
                         f"frozen, {time.monotonic() - thawed:.1f}s after SIGCONT")
                break
            await asyncio.sleep(0.25)
        while not fr.rejoined:
            fr.rejoined = bool(await self._health(node, "healthy"))
            if not fr.rejoined:
                await asyncio.sleep(0.25)
        self.say(f"{node} rejoined, {time.monotonic() - thawed:.1f}s after SIGCONT")

    # -- the summary ------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        seen = self.seen
        errors = [*seen.errors, *self.cluster.crashes]
        counts = self.counts(errors)
        alive = alive_by_node(self.root / "workers")
        where = self.ledger.state().where
        rejoined = 0
        for fr in self.freezes:
            still = [i for i in fr.moved if fr.node in alive.get(i, ()) and where.get(i) != fr.node]
            if still:
                errors.append(f"{fr.node} still runs {len(still)} instances moved away while "
                              f"it was frozen, e.g. {still[0]}")
            elif fr.replaced and fr.rejoined:
                rejoined += 1
        for kind, least in self.least.items():
            if seen.faults[kind] < least:
                errors.append(f"{kind}: {seen.faults[kind]} injected, the plan's minimum is "
                              f"{least}")
        if self.least and rejoined < self.least.get("worker_freeze", 0):
            errors.append(f"only {rejoined} of the {len(self.freezes)} frozen nodes rejoined "
                          "after their instances were re-placed; the plan's minimum is "
                          f"{self.least['worker_freeze']}")
        violations = self.cluster.violations()
        if violations:
            errors.append(f"nats-server logged {violations} permissions violations "
                          f"(see {self.cluster.nats.log})")
        return {
            **counts,
            "faults": {k: seen.faults[k] for k in FAULTS},
            "minimums": dict(self.least),
            "rejoined_after_move": rejoined,
            "ok": not errors,
            "clean": not errors and not self.verdict.ended_lost,
            "cas_conflicts": count_in(self.root / "logs" / "broker.log",
                                      b"state branch moved under us"),
            "moved_while_frozen": sum(len(f.moved) for f in self.freezes),
            "room": {"cpu": self.cluster.room.cpu, "memory_mb": self.cluster.room.memory_mb},
            "auth": {"nodes": len(self.cluster.ids.nodes), "violations": violations},
            "seed": self.opts.seed,
            "overlap": self.opts.overlap,
            "errors": errors[:20],
        }


async def run(opts: Options) -> dict[str, Any]:
    """One chaos run; the summary (``ok`` says whether every check held)."""
    root = (opts.state or Path(tempfile.mkdtemp(prefix="gavel-chaos-"))).resolve()
    root.mkdir(parents=True, exist_ok=True)
    Ledger(root / "state.git")  # the bare state repository, before anyone writes to it
    cluster = Cluster(root, node_ids(opts.workers),
                      room(submissions(opts.seed, opts.duration), opts.workers))
    say(f"state and logs under {root}")
    nc: Any = None
    try:  # the one way out (`bench.interrupt`)
        await whole(cluster.nats.start)
        cluster.start_broker()
        for node in cluster.nodes:
            cluster.start_worker(node)
        nc = await connect(cluster.nats.url, cluster.operator_creds, allow_reconnect=True,
                           max_reconnect_attempts=-1, reconnect_time_wait=0.25)
        await wait_healthy(nc, opts.workers, 60)
        chaos = Chaos(opts, root, cluster, nc)
        await chaos.drive()
        summary = await asyncio.to_thread(chaos.summary)
    finally:
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.close()
        cluster.stop()  # blocking: a second signal cannot cut it short
    finish(summary, root, opts.state, opts.keep)
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gavel.bench.chaos", description=__doc__.split(
        "\n\n")[0] if __doc__ else None)
    p.add_argument("--duration", type=float, default=DURATION, metavar="S",
                   help="seconds of faults and submissions (default %(default)g: the full "
                        "minimums; a shorter run injects proportionally fewer, one of each "
                        "at least)")
    options(p, workers=4, settle_s=60.0)
    p.add_argument("--overlap", action="store_true",
                   help="let faults overlap (a broker restart during a worker outage...)")
    args = p.parse_args(argv)
    if args.duration <= 0 or args.workers < 2:
        p.error("--duration must be positive and --workers at least 2")
    try:
        summary = asyncio.run(stopped_by_signals(run(Options(
            duration=args.duration, workers=args.workers, seed=args.seed, state=args.state,
            settle_s=args.settle, keep=args.keep, overlap=args.overlap))))
    except (Exception, KeyboardInterrupt) as exc:  # the run itself broke: still a summary
        summary = broken(exc, args.seed, dict.fromkeys(FAULTS, 0), rejoined_after_move=0)
    return report(summary, f"chaos, seed {summary['seed']}: {summary['submitted']} submitted, "
                  f"{summary['placed_once']} placed once, {summary['terminal']} terminal, "
                  f"{summary['ended_lost']} ended lost by the broker, "
                  f"{summary['unschedulable']} unschedulable, {summary['lost']} lost, "
                  f"{summary['duplicated']} duplicated; faults {summary['faults']}, "
                  f"{summary['rejoined_after_move']} rejoined after their instances moved",
                  args.json)


if __name__ == "__main__":
    sys.exit(main())
