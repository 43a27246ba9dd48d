"""One benchmark run: real nats-server, the broker as a child process with a real git state
repo, N live agents in a few processes, M placements submitted as fast as the broker takes
them, then a check from git that every placement asked for is in exactly one node.json and
nothing else is; last, one idle `gavel worker` beside the listening broker (`bench.idle`).

Rules:
1. Every figure is measured in this run on this machine; the ceilings are measured beside
   it so the ratios say how close gavel is to what the machine allows.
2. A memory figure is the process's peak over the run (the kernel's high-water mark), not
   what it holds at the end: a bound on RSS is a bound on the most it took.
3. The bench checks what it asked for: each submission's reply names exactly the ids the
   bench asked for, and the verification compares the tree with those ids
   (`bench.verify`, rules 3 and 4).
4. With `ha` the broker leads as one of several would (`broker.ha`): its lease on the one
   server, every commit pushed to a bare repository under the run's directory before its
   awards go out. The placements are counted as without it (committed), `push_lag_ms` is
   how long after the last one the remote held them all, `durable_per_s` counts up to then
   (without HA a commit is durable where it lands: the same as `placements_per_s`), and the
   verification reads the remote.
5. `run_with` starts the same processes and hands them (`Rig`) to another driver, which
   uses them as it will (`bench.tuning` changes the broker's settings as it runs) and is
   stopped with them however it ends.
6. `run` measures the bare auctioneer (`bench.bare`) on either side of its placements:
   rounds of the run's shape (its batch, rounds in flight and d; the ladder's throughput end
   for what the broker tunes) against the run's agents, `bare_s` seconds each, once before
   the broker starts and once after it stopped (no broker hears them: `bench.bare` rule 3).
   `bare_rounds_per_s` is their mean: the hour sampled at both ends of the run, as one
   window after it cannot (docs/performance.md), and `ratio_to_bare_rounds` the run's
   placements/s over it. The same for the tail: `bare_round_p99_ms` is the mean of the two
   windows' round p99s and `round_p99_in_bare_p99` the run's round p99 over it (information:
   no target is judged by it yet). So the agents start before the broker, which asks them to
   heartbeat at once (`bench.agentprocs` rule 3).
7. An open loop with `rate_share` offers that share of the bare auctioneer's rate measured
   before the broker started, at most `rate`: a fixed rate asks a slow hour for more of its
   machine than a quick one, and keeping up then says as much of the hour as of the code.
8. What the hour took is measured beside the figures, never judged: the load average as
   the placements began and ended, and how long the broker, the agent processes and this
   driver (the probe's process) each waited for a CPU, on average, each time they became
   runnable (`cpu_wait_us`: `bench.hour`, the kernel's schedstat). A ratio to a ceiling
   cancels the hour while the figure's processes and the ceiling's wait alike; where the
   broker and agents wait several times what the probe does, the round p99 carries a share
   of the hour the probe's does not.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pygit2

from gavel.bench import bare
from gavel.bench.agentprocs import cpu_s, peak_rss_mb, spawn, start_agents, stop
from gavel.bench.ceilings import Probe, git_cli_commits_per_s, nats_reqreply_per_s
from gavel.bench.hour import Waits
from gavel.bench.idle import IdleWorkerFailed, idle_worker
from gavel.bench.interrupt import Interrupted, stopped_by_signals
from gavel.bench.verify import VerifyError, answered, verify, verify_churn
from gavel.bench.waits import until_healthy, until_placed
from gavel.shared.api import (
    NodesReply,
    NodesRequest,
    StatsReply,
    SubmitReply,
    SubmitRequest,
    counted_ids,
)
from gavel.shared.timing import Timing
from gavel.shared.tuning import LADDER
from gavel.transport.client import call, connect
from gavel.transport.natsserver import NatsServer

__all__ = ["IdleWorkerFailed", "Options", "Result", "Rig", "RunFailed", "VerifyError",
           "offered", "peak_rss_mb", "run", "run_with", "submit_all"]

R = TypeVar("R")


@dataclass
class Options:
    agents: int = 1000
    placements: int = 20_000
    mode: str = "sampled"
    d: int = 2
    processes: int = 4
    #: None: the broker tunes it (`shared.tuning`); a value pins it.
    batch_max: int | None = None
    max_auctions: int | None = None
    batch_wait_ms: float = 0.0
    commit_gap_ms: float | None = None
    #: Instances end (status 0) this long after they start (0: they run for ever), and the
    #: broker keeps at most `ended_max` ended records: a run with churn and retention.
    lifetime_s: float = 0.0
    ended_max: int = 100_000
    #: How the agents speak NATS: `bench.natslite` ("lite") or nats-py, as the worker does.
    agent_client: str = "lite"
    chunk: int = 1000
    #: Submit at this many placements a second (open loop), or 0: as fast as taken.
    rate: float = 0.0
    #: Rule 7: the open loop's share of the hour's ceiling, at most `rate` (0: `rate`).
    rate_share: float = 0.0
    timeout_s: float = 600.0
    idle_s: float = 10.0
    progress: bool = True
    state: Path | None = None
    #: Rule 4.
    ha: bool = False
    #: More flags for the broker (`bench.brokerproc`): the alternatives `bench.complexity`
    #: measures.
    broker_flags: tuple[str, ...] = ()
    #: Rule 6: seconds of the bare auctioneer's rounds after the run (0: not measured).
    bare_s: float = 2.5


@dataclass
class Result:
    agents: int
    placements: int
    mode: str
    d: int
    agent_client: str
    seconds: float
    placements_per_s: float
    round_p50_ms: float
    round_p99_ms: float
    commit_p99_ms: float
    commits: int
    #: node.json puts into the KV mirror (JetStream), coalesced by `broker.mirror`.
    kv_puts: int
    #: The broker process's peak resident memory over the run (rule 2).
    broker_rss_mb: float
    agent_rss_mb: float
    bids_per_s: float
    broker_cpu_us_per_placement: float
    writer_cpu_us_per_placement: float
    agent_cpu_us_per_reply: float
    #: The broker's CPU a placement in units of an agent's CPU a reply: the agents run the
    #: same code on both sides of an A/B, so this cancels the machine's drift between runs
    #: (every process's CPU moves far more than this ratio does: docs/performance.md).
    broker_cpu_in_agent_replies: float
    nats_cpu_us_per_placement: float
    #: Every process of the run (broker, writer, agents, nats-server, this driver) over
    #: elapsed time and the machine's cores: how close to saturation the figures were taken.
    machine_busy_pct: float
    nats_reqreply_per_s: float
    git_cli_commits_per_s: float
    idle_worker_cpu_pct: float
    idle_worker_rss_mb: float
    ratio_to_nats_reqreply: float
    ratio_to_git_cli: float
    verified: bool
    #: Rule 1: the round p99 over the p99 of raw nats-py request/replies made one at a time
    #: during the same seconds (`bench.ceilings.Probe`): a bid round's tail in round trips.
    nats_reqreply_p99_ms: float = 0.0
    round_p99_in_reqreply_p99: float = 0.0
    #: An open loop's offered placements a second (rule 7; 0: a closed loop) and the
    #: placements/s over it: whether the broker kept up with what it was offered.
    offered_per_s: float = 0.0
    ratio_to_offered: float = 0.0
    #: Where the broker's tuning ended (`shared.tuning`: 0 the latency end), how often it moved.
    tuned_level: int = 0
    tuned_changes: int = 0
    #: The windows it judged last (`shared.tuning` rule 8): why it ended where it did.
    tuned_trace: list[str] = field(default_factory=list)
    #: With churn (`lifetime_s`): instances still placed, ended records kept, forgotten.
    lifetime_s: float = 0.0
    running_at_end: int = 0
    ended_kept: int = 0
    forgotten: int = 0
    #: Messages the broker refused during the run, by kind (a healthy run has none: a late
    #: bid or a bid the broker cannot accept shows here before it shows in the latencies).
    rejected: dict[str, int] = field(default_factory=dict)
    #: Rule 4: whether the broker led as with HA, and how long the remote lagged at the end.
    ha: bool = False
    push_lag_ms: float = 0.0
    durable_per_s: float = 0.0
    #: Rule 6: the bare auctioneer's placements/s (`bench.bare`) and the run's over it: what
    #: gavel keeps of what its protocol places from one process with these agents.
    bare_rounds_per_s: float = 0.0
    ratio_to_bare_rounds: float = 0.0
    #: The bare auctioneer's placements/s before and after the run (rule 6).
    bare_rounds_windows: list[float] = field(default_factory=list)
    #: Rule 6: the bare rounds' p99 (the mean of both windows') and the run's round p99 over it.
    bare_round_p99_ms: float = 0.0
    round_p99_in_bare_p99: float = 0.0
    #: Rule 8: the 1-minute load average as the placements began and as they ended.
    load_avg: tuple[float, float] = (0.0, 0.0)
    #: Rule 8: microseconds waited for a CPU a turn on one, by process: "broker", "agents"
    #: (all agent processes), "probe" (this driver, the probe's requester and responder).
    cpu_wait_us: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def ratios(self) -> str:
        """Rule 1's ratios in one line: what holds from hour to hour."""
        offered = (f", / offered {self.ratio_to_offered:g}" if self.offered_per_s else "")
        bare_ = (f"placements/s / bare rounds/s {self.ratio_to_bare_rounds:g}, "
                 if self.bare_rounds_per_s else "placements/s ")
        tail = (f", / bare rounds' p99 {self.round_p99_in_bare_p99:g}"
                if self.bare_round_p99_ms else "")
        return (f"{bare_}/ nats req-reply/s {self.ratio_to_nats_reqreply:g}{offered}, "
                f"round p99 / req-reply p99 {self.round_p99_in_reqreply_p99:g}{tail}, broker CPU a "
                f"placement in agent replies {self.broker_cpu_in_agent_replies:g}, / naive git "
                f"commits {self.ratio_to_git_cli:g}")

    def hour(self) -> str:
        """Rule 8 in one line: what the hour took while the figures were taken."""
        waits = ", ".join(f"{who} {w:g}" for who, w in self.cpu_wait_us.items())
        return (f"load {self.load_avg[0]:g}-{self.load_avg[1]:g}"
                + (f"; waited for a CPU each turn, us: {waits}" if waits else ""))


async def run(opts: Options) -> Result:
    """One run. Without `opts.state` it works in a temporary directory, removed after a run
    that verified (each run leaves its git repository and JetStream store there); a failed
    run's is kept, and the error names it."""
    return await run_with(opts, _placements, bare_before=opts.bare_s > 0)


async def run_with(opts: Options, drive: Callable[[Rig], Awaitable[R]],
                   bare_before: bool = False) -> R:
    """`run`'s processes, started and stopped as for `run`, with `drive` using them in
    between (rule 5); with `bare_before`, the bare auctioneer measured before the broker
    starts (rule 6)."""
    root = opts.state if opts.state is not None else Path(tempfile.mkdtemp(prefix="gavel-bench-"))
    try:  # its finally stops all
        result = await stopped_by_signals(_run_in(opts, root, drive, bare_before))
    except Interrupted as exc:
        raise RunFailed(f"{exc} (the run's state is kept in {root})") from None
    except VerifyError as exc:
        raise VerifyError(f"{exc} (the run's state is kept in {root})") from exc
    except Exception as exc:  # whatever broke, the sentence says what and where to look
        raise RunFailed(f"{type(exc).__name__}: {exc or 'no detail'} (the run's state is "
                        f"kept in {root})") from exc
    if opts.state is None:
        shutil.rmtree(root, ignore_errors=True)
    return result


class RunFailed(Exception):
    """The run did not get to verification: a process that would not start, a lost
    connection; the message names what and the directory kept."""


@dataclass
class Rig:
    """What a run started, for the driver that uses it (rule 5): the driver's connection,
    the run's options and directory, the broker and agent processes, the nats-server's
    pid, and the ceilings measured before the broker started."""

    nc: Any
    url: str
    opts: Options
    root: Path
    broker: subprocess.Popen[bytes]
    agents: list[subprocess.Popen[bytes]]
    nats_pid: int
    nats_rr: float
    git_cli: float
    probe: Probe
    #: Rule 6: the bare auctioneer measured before the broker started (None: not asked).
    bare_first: bare.Bare | None = None

    @property
    def bare_before(self) -> float:
        """Rule 6: the bare auctioneer's placements/s before the broker started (0: not
        asked)."""
        return self.bare_first.placements_per_s if self.bare_first is not None else 0.0


def offered(opts: Options, bare_before: float) -> Options:
    """Rule 7: `opts` offering its share of `bare_before`, at most its rate."""
    if not opts.rate_share or not bare_before:
        return opts
    rate = min(opts.rate or math.inf, opts.rate_share * bare_before)
    return dataclasses.replace(opts, rate=round(rate, 1))


async def _placements(rig: Rig) -> Result:
    """The driver of `run`: the placements asked for, measured and verified; then the idle
    worker."""
    result = await _drive(rig.nc, offered(rig.opts, rig.bare_before), rig.root, rig.broker,
                          rig.agents, rig.nats_pid, rig.nats_rr, rig.git_cli, rig.probe)
    if rig.opts.idle_s > 0:  # the broker still listens; nothing is left to place
        cpu, rss = await idle_worker(rig.nc, rig.url, rig.root / "idle-worker",
                                     rig.root / "logs" / "idle-worker.log", rig.opts.idle_s)
        result = dataclasses.replace(result, idle_worker_cpu_pct=round(cpu, 2),
                                     idle_worker_rss_mb=round(rss, 1))
    first = rig.bare_first
    if first is not None:
        await asyncio.to_thread(stop, [rig.broker])
        after = await _bare_rounds(rig.url, rig.opts, len(rig.agents), rig.root)
        ceiling = (first.placements_per_s + after.placements_per_s) / 2
        tail = (first.round_p99_ms + after.round_p99_ms) / 2
        result = dataclasses.replace(
            result, bare_rounds_per_s=round(ceiling, 1),
            bare_rounds_windows=[first.placements_per_s, after.placements_per_s],
            ratio_to_bare_rounds=round(result.placements_per_s / ceiling, 3),
            bare_round_p99_ms=round(tail, 3),
            round_p99_in_bare_p99=round(result.round_p99_ms / tail, 2) if tail else 0.0)
    return result


async def _bare_rounds(url: str, opts: Options, processes: int, root: Path) -> bare.Bare:
    """Rule 6: the bare auctioneer's rounds of the run's shape against the run's agents, no
    broker running (`bench.bare` rule 3)."""
    end = LADDER[-1]  # what a tuned closed loop climbs to
    ceiling = await bare.beside(
        url, opts.agents, processes, batch=opts.batch_max or end.batch_max,
        in_flight=opts.max_auctions or end.max_auctions,
        d=opts.d if opts.mode == "sampled" else 0, seconds=opts.bare_s,
        log=root / "logs" / "bare.log")
    return ceiling


async def _run_in(opts: Options, root: Path, drive: Callable[[Rig], Awaitable[R]],
                  bare_before: bool) -> R:
    (root / "logs").mkdir(parents=True, exist_ok=True)
    server = NatsServer(store_dir=root / "nats", log=root / "logs" / "nats.log",
                        max_payload_mb=8)
    server.start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        nats_rr = await nats_reqreply_per_s(server.url)
        git_cli = await asyncio.to_thread(git_cli_commits_per_s)
        broker_args = ["--url", server.url, "--state", str(root),
                       "--batch-wait-ms", str(opts.batch_wait_ms),
                       "--ended-max", str(opts.ended_max)]
        for flag, value in (("--batch-max", opts.batch_max),
                            ("--max-auctions", opts.max_auctions),
                            ("--commit-gap-ms", opts.commit_gap_ms)):
            if value is not None:  # otherwise the broker tunes it
                broker_args += [flag, str(value)]
        if opts.mode == "sampled":
            broker_args += ["--sample-d", str(opts.d)]
        if opts.ha:  # rule 4
            remote = root / "remote.git"
            pygit2.init_repository(str(remote), bare=True, initial_head="main")
            broker_args += ["--ha-remote", str(remote)]
        broker_args += opts.broker_flags
        heartbeat_s = Timing.from_env(os.environ).heartbeat_s
        agent_procs = await start_agents(
            server.url, opts.agents, opts.processes, root / "logs",
            lifetime_s=opts.lifetime_s, client=opts.agent_client,
            heartbeat_s=heartbeat_s,  # the broker's clocks (GAVEL_FAST_TIMERS too)
            started=procs)
        before = await _bare_rounds(server.url, opts, len(agent_procs), root) \
            if bare_before else None
        broker = spawn("gavel.bench.brokerproc", broker_args, root / "logs" / "broker.log")
        procs.append(broker)
        nc = await connect(server.url)
        try:
            assert server.proc is not None
            return await drive(Rig(nc, server.url, opts, root, broker, agent_procs,
                                   server.proc.pid, nats_rr, git_cli, Probe(server.url),
                                   before))
        finally:
            await nc.close()
    finally:
        stop(procs)
        server.stop()


def submit_all(nc: Any, opts: Options, started: float,
               prefix: str = "b") -> tuple[list[str], asyncio.Future[list[None]]]:
    """Every placement asked for (rule 3: the ids asked for, in order) and the submits'
    future. Paced (`rate`): small chunks, each sent when its first placement is due, so the
    broker sees a steady arrival rate and the round times are those of that load."""
    spec = bare.SPEC
    chunk = max(1, round(opts.rate / 50)) if opts.rate else opts.chunk
    sem = asyncio.Semaphore(64 if opts.rate else 4)
    chunks = {k: counted_ids(f"{prefix}{k:07d}", min(chunk, opts.placements - k))
              for k in range(0, opts.placements, chunk)}

    async def submit(k: int, asked: list[str]) -> None:
        if opts.rate:
            await asyncio.sleep(max(0.0, started + k / opts.rate - time.perf_counter()))
        async with sem:
            req = SubmitRequest(spec=spec, instance_id=f"{prefix}{k:07d}", count=len(asked))
            reply = await call(nc, "submit", req, SubmitReply, timeout=60)
        answered(asked, reply.ids())

    ids = [iid for asked in chunks.values() for iid in asked]
    return ids, asyncio.gather(*(submit(k, asked) for k, asked in chunks.items()))


async def _drive(nc: Any, opts: Options, root: Path, broker: subprocess.Popen[bytes],
                 agent_procs: list[subprocess.Popen[bytes]], nats_pid: int, nats_rr: float,
                 git_cli: float, probe: Probe) -> Result:
    stats = await until_healthy(nc, opts.agents, root, broker)
    cpu0 = cpu_s(broker), sum(cpu_s(p) for p in agent_procs), cpu_s(broker, children=True)
    nats0, self0 = cpu_s(nats_pid), time.process_time()
    waits = Waits(broker.pid, [p.pid for p in agent_procs])
    await probe.start()
    started = time.perf_counter()
    ids, submitting = submit_all(nc, opts, started)
    # With churn instances leave their node.json again: count awards committed instead.
    def placed(s: StatsReply) -> int:
        return s.placed_total if opts.lifetime_s > 0 else s.placed_now
    base = placed(stats)
    replies0 = stats.bids_received
    try:
        stats = await until_placed(nc, opts.placements, placed, base, broker,
                                   timeout_s=opts.timeout_s,
                                   progress=started if opts.progress else None)
    finally:
        rr_p99 = await probe.stop()
    elapsed = time.perf_counter() - started
    waited = waits.per_turn_us()
    await submitting
    if opts.progress:
        sys.stderr.write("\n")
    broker_cpu = cpu_s(broker) - cpu0[0]
    writer_cpu = cpu_s(broker, children=True) - cpu0[2]
    agent_cpu = sum(cpu_s(p) for p in agent_procs) - cpu0[1]
    nats_cpu = cpu_s(nats_pid) - nats0
    busy = broker_cpu + writer_cpu + agent_cpu + nats_cpu + time.process_time() - self0
    broker_rss = peak_rss_mb(broker.pid)
    agent_rss = sum(psutil.Process(p.pid).memory_info().rss for p in agent_procs) / 2**20
    nodes = await call(nc, "nodes", NodesRequest(), NodesReply, timeout=30)
    lag = await _remote_lag(root, elapsed + started) if opts.ha else 0.0
    churn = None
    if opts.lifetime_s > 0:
        churn = await asyncio.to_thread(verify_churn, root, ids)
    else:
        verify(root, ids, root / "remote.git" if opts.ha else None)
    rate = opts.placements / elapsed
    agent_reply_us = 1e6 * agent_cpu / max(1, stats.bids_received - replies0)
    return Result(
        agents=opts.agents, placements=opts.placements, mode=opts.mode, d=opts.d,
        agent_client=opts.agent_client, seconds=round(elapsed, 3), placements_per_s=round(rate, 1),
        round_p50_ms=round(stats.round_p50_ms, 2), round_p99_ms=round(stats.round_p99_ms, 2),
        commit_p99_ms=round(stats.commit_p99_ms, 2), commits=stats.commits,
        kv_puts=stats.kv_puts,
        broker_rss_mb=round(broker_rss, 1), agent_rss_mb=round(agent_rss / opts.agents, 3),
        bids_per_s=round((stats.bids_received - replies0) / elapsed, 1),
        broker_cpu_us_per_placement=round(1e6 * broker_cpu / opts.placements, 1),
        writer_cpu_us_per_placement=round(1e6 * writer_cpu / opts.placements, 1),
        agent_cpu_us_per_reply=round(agent_reply_us, 1),
        broker_cpu_in_agent_replies=round(
            1e6 * broker_cpu / opts.placements / agent_reply_us, 2) if agent_reply_us else 0.0,
        nats_cpu_us_per_placement=round(1e6 * nats_cpu / opts.placements, 1),
        machine_busy_pct=round(100 * busy / elapsed / (os.cpu_count() or 1), 1),
        nats_reqreply_per_s=round(nats_rr, 1), git_cli_commits_per_s=round(git_cli, 1),
        idle_worker_cpu_pct=0.0, idle_worker_rss_mb=0.0,  # measured after (`run`)
        ratio_to_nats_reqreply=round(rate / nats_rr, 3) if nats_rr else 0.0,
        ratio_to_git_cli=round(rate / git_cli, 1) if git_cli else 0.0, verified=True,
        nats_reqreply_p99_ms=round(rr_p99, 3), tuned_level=stats.tuned_level,
        offered_per_s=opts.rate,
        ratio_to_offered=round(rate / opts.rate, 3) if opts.rate else 0.0,
        tuned_changes=stats.tuned_changes,
        tuned_trace=list(stats.tuned_trace),
        round_p99_in_reqreply_p99=round(stats.round_p99_ms / rr_p99, 2) if rr_p99 else 0.0,
        lifetime_s=opts.lifetime_s, running_at_end=churn.running if churn else 0,
        ended_kept=churn.ended_kept if churn else 0, forgotten=churn.forgotten if churn else 0,
        rejected=dict(nodes.rejected), ha=opts.ha, push_lag_ms=round(1000 * lag, 1),
        durable_per_s=round(opts.placements / (elapsed + lag), 1),
        load_avg=(waits.load, round(os.getloadavg()[0], 2)), cpu_wait_us=waited)



async def _remote_lag(root: Path, placed_at: float, timeout: float = 120.0) -> float:
    """Rule 4: seconds from `placed_at` (perf_counter) until the remote's branch is the
    broker's (each looked at every 10 ms)."""
    ref = "refs/heads/main"
    local, remote = pygit2.Repository(str(root / "state.git")), pygit2.Repository(
        str(root / "remote.git"))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ours, theirs = local.references.get(ref), remote.references.get(ref)
        if ours is not None and theirs is not None and ours.target == theirs.target:
            return max(0.0, time.perf_counter() - placed_at)
        await asyncio.sleep(0.01)
    raise VerifyError(f"the remote did not hold the broker's branch within {timeout:g}s")


def main_env() -> dict[str, str]:
    return dict(os.environ)
