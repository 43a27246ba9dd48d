"""The chaos run's plan, all drawn from the seed: which faults, when, on which node, for how
long; when someone else commits; what is submitted when; how big the fleet is. Pure functions
of the seed — the same seed gives the same plan (a test says so); when it lands depends on the
machine.

Rules:
1. Minimums are scheduled, never hoped for. `minimums(duration)` is how many of each kind a
   run of that length injects at least (`FULL` at `DURATION`, scaled down for shorter runs,
   one of each however short); `schedule` places every one of them first, each with its
   longest hold and gap, inside `duration` (`worst_case` says so), then adds seeded extras
   while they fit.
2. Two lanes, each one fault at a time. The cluster lane (broker kill -9, nats-server restart,
   worker freeze) never overlaps itself, so a broker restart never resets the clock of a
   freeze. The kill lane (worker kill -9) runs beside it on another node than the frozen one
   (`Chaos._target`), so at most one node is frozen and one down at any moment.
3. The fleet has room for what is submitted even then: `room` sizes each node so the
   sleepers fit, twice over, on the nodes left when one is frozen and one is down. Work the
   broker still leaves unschedulable for want of room is counted on its own, never as lost.
4. The specs pick their policies deliberately. No restart in place: a sleeper never exits
   under chaos (a worker's kill -9 leaves its children running), a blip exits 0; any other
   exit is a finding, handed back to the broker and seen, never hidden by a quiet restart.
   And the most placements a spec may have (`Spec.attempts`, 100): a sleeper lives through
   every node outage of the run, and each one past offline spends a placement; with the
   default budget the broker would end it `lost` for attempts spent on faults the run
   injected, not on anything the workload did.
5. The HA run (`ha_schedule`, `bench.chaosha`) has the same two lanes: its cluster lane
   kills the leading broker, kills a standby, or kills one nats-server of three, one at a
   time (so a majority of servers and a broker to take over are always left); its kill
   lane kills workers as above. Leader kills weigh double among the extras: failovers are
   what the run is for.
6. A lane that runs late still injects the minimums: each HA fault waits for a leader or a
   takeover, so on a loaded machine the lane may pass the run's duration; a fault is still
   due then only while its kind is short of its minimum (`due`), the extras are dropped.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gavel.shared.messages import Spec
from gavel.shared.spec import Restart
from gavel.shared.timing import FAST_FACTOR, Timing

__all__ = ["BLIP", "CLUSTER_LANE", "DURATION", "FAULTS", "FULL", "HA_DURATION", "HA_FULL",
           "HA_KINDS", "KILL_LANE", "KINDS", "SLEEPER", "STRATEGIES", "TIMING", "Fault", "Room",
           "Submission", "due", "foreign_times", "ha_minimums", "ha_schedule", "minimums",
           "node_ids", "room", "schedule", "submissions", "worst_case"]

KINDS = ("broker_kill", "nats_restart", "worker_kill", "worker_freeze")
FAULTS = (*KINDS, "foreign_commit")
CLUSTER_LANE = ("broker_kill", "nats_restart", "worker_freeze")
KILL_LANE = ("worker_kill",)
STRATEGIES = ("least-loaded", "binpack", "spread", "headroom")
#: The run always uses fast timers; schedules are drawn in these units.
TIMING = Timing().scaled(FAST_FACTOR)
#: `make chaos`: seconds of faults and submissions, and what that run injects at least.
DURATION = 420.0
FULL: Mapping[str, int] = {"broker_kill": 20, "nats_restart": 5, "worker_kill": 50,
                           "worker_freeze": 4}
#: `make chaos-ha`: seconds of faults and submissions, and what that run injects at least
#: (rule 5).
HA_KINDS = ("leader_kill", "standby_kill", "nats_restart", "worker_kill")
HA_CLUSTER_LANE = ("leader_kill", "standby_kill", "nats_restart")
HA_DURATION = 240.0
HA_FULL: Mapping[str, int] = {"leader_kill": 12, "standby_kill": 4, "nats_restart": 4,
                              "worker_kill": 20}
_NO_RESTART = Restart(attempts=0)
_PLACEMENTS = 100  # the most `Spec.attempts` allows (rule 4)
SLEEPER = Spec(name="sleeper", command=["sleep", "3600"], cpu=0.05, memory_mb=16,
               attempts=_PLACEMENTS, restart=_NO_RESTART)
BLIP = Spec(name="blip", command=["sh", "-c", "exit 0"], cpu=0.05, memory_mb=16,
            attempts=_PLACEMENTS, restart=_NO_RESTART)
#: Of the worker kills, one in this many stays down past offline (re-placed, then fenced).
_LONG_KILL_EVERY = 5


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after injection starts
    kind: str
    node: str = ""
    hold: float = 0.0  # downtime, pause before the restart, or how long it stays frozen


@dataclass(frozen=True)
class Submission:
    at: float
    instance_id: str
    long: bool  # a sleeper that stays placed, or a blip that exits 0 at once


@dataclass(frozen=True)
class Room:
    """What each worker declares (rule 3)."""

    cpu: float
    memory_mb: int


def node_ids(workers: int) -> list[str]:
    return [f"node-{i + 1}" for i in range(workers)]


def minimums(duration: float) -> dict[str, int]:
    """How many of each kind a run of `duration` injects at least (rule 1)."""
    scale = min(1.0, duration / DURATION)
    return {k: max(1, math.floor(FULL[k] * scale + 1e-9)) for k in KINDS}


def ha_minimums(duration: float) -> dict[str, int]:
    """Rule 1 for the HA run (rule 5)."""
    scale = min(1.0, duration / HA_DURATION)
    return {k: max(1, math.floor(HA_FULL[k] * scale + 1e-9)) for k in HA_KINDS}


# Each kind's hold and the gap after it, in heartbeats, as (low, high); a freeze and a long
# kill hold past offline on top.
_HOLD = {"broker_kill": (0.2, 2.0), "nats_restart": (0.5, 2.0), "worker_freeze": (5.0, 8.0),
         "worker_kill": (0.5, 3.0), "long_kill": (1.0, 3.0), "leader_kill": (0.2, 2.0),
         "standby_kill": (0.2, 2.0)}
_GAP = {"cluster": (1.5, 4.0), "kill": (1.0, 2.5)}
_START = 4.0  # heartbeats before the first fault of a lane


def _hold(kind: str, rng: random.Random, timing: Timing) -> float:
    lo, hi = _HOLD[kind]
    past = timing.offline_s if kind in ("worker_freeze", "long_kill") else 0.0
    return past + rng.uniform(lo, hi) * timing.heartbeat_s


def worst_case(counts: Mapping[str, int], timing: Timing = TIMING) -> dict[str, float]:
    """The longest each lane can take to inject `counts` (every hold and gap at its top)."""
    hb, off = timing.heartbeat_s, timing.offline_s

    def top(kind: str, gap: str) -> float:
        return (off if kind in ("worker_freeze", "long_kill") else 0.0) \
            + (_HOLD[kind][1] + _GAP[gap][1]) * hb

    kills = counts.get("worker_kill", 0)
    long = _long_kills(kills)
    return {
        "cluster": _START * hb + sum(counts.get(k, 0) * top(k, "cluster")
                                     for k in CLUSTER_LANE),
        "kill": _START * hb + long * top("long_kill", "kill")
        + (kills - long) * top("worker_kill", "kill"),
    }


def _long_kills(kills: int) -> int:
    return max(1, kills // _LONG_KILL_EVERY) if kills else 0


def schedule(seed: int, duration: float, nodes: Sequence[str], timing: Timing = TIMING,
             overlap: bool = False, least: Mapping[str, int] | None = None) -> list[Fault]:
    """The faults of both lanes, in order of time (rule 1, 2). Each lane first injects its
    minimums (`least`, by default `minimums(duration)`) in a seeded order, then seeded picks
    while they fit in `duration`. Within a lane each fault ends (restart, thaw) before the
    next starts; with `overlap` the next starts a gap after the previous one *started*. A
    worker fault's node is the seeded one unless it holds nothing then or is taken by the
    other lane (see `Chaos._target`)."""
    need = dict(minimums(duration) if least is None else least)
    rng = random.Random(f"gavel-chaos/faults/{seed}")
    cluster = [k for k in CLUSTER_LANE for _ in range(need.get(k, 0))]
    rng.shuffle(cluster)
    if cluster and cluster[0] == "worker_freeze":  # something placed by then, to move away
        k = next((i for i, kind in enumerate(cluster) if kind != "worker_freeze"), 0)
        cluster[0], cluster[k] = cluster[k], cluster[0]
    kills = need.get("worker_kill", 0)
    long = set(rng.sample(range(kills), _long_kills(kills))) if kills else set()
    out = _lane(rng, cluster, ("broker_kill", "nats_restart", "worker_freeze"), (1, 1, 1),
                "cluster", duration, nodes, timing, overlap)
    kill_plan = ["long_kill" if i in long else "worker_kill" for i in range(kills)]
    out += _lane(rng, kill_plan, ("worker_kill", "long_kill"), (_LONG_KILL_EVERY - 1, 1),
                 "kill", duration, nodes, timing, overlap)
    return sorted(out, key=lambda f: (f.at, f.kind, f.node))


def due(kind: str, late: bool, injected: Mapping[str, int], least: Mapping[str, int]) -> bool:
    """Whether a planned fault of `kind` is still injected (rule 6): on time always; `late`
    (its lane passed the run's duration) only while `injected` is short of `least`."""
    return not late or injected.get(kind, 0) < least.get(kind, 0)


def ha_schedule(seed: int, duration: float, nodes: Sequence[str], timing: Timing = TIMING,
                least: Mapping[str, int] | None = None) -> list[Fault]:
    """Rule 5's faults, in order of time: each lane's minimums first in a seeded order, then
    seeded picks while they fit. A broker fault's target (the leader, a standby) and a
    nats-server's are chosen when it lands: who leads is known only then."""
    need = dict(ha_minimums(duration) if least is None else least)
    rng = random.Random(f"gavel-chaos-ha/faults/{seed}")
    cluster = [k for k in HA_CLUSTER_LANE for _ in range(need.get(k, 0))]
    rng.shuffle(cluster)
    kills = need.get("worker_kill", 0)
    long = set(rng.sample(range(kills), _long_kills(kills))) if kills else set()
    out = _lane(rng, cluster, HA_CLUSTER_LANE, (2, 1, 1), "cluster", duration, nodes,
                timing, False)
    kill_plan = ["long_kill" if i in long else "worker_kill" for i in range(kills)]
    out += _lane(rng, kill_plan, ("worker_kill", "long_kill"), (_LONG_KILL_EVERY - 1, 1),
                 "kill", duration, nodes, timing, False)
    return sorted(out, key=lambda f: (f.at, f.kind, f.node))


def _lane(rng: random.Random, first: list[str], extra: tuple[str, ...],
          weights: tuple[int, ...], gap: str, duration: float, nodes: Sequence[str],
          timing: Timing, overlap: bool) -> list[Fault]:
    hb = timing.heartbeat_s
    out: list[Fault] = []
    at = _START * hb
    while True:
        n = len(out)
        kind = first[n] if n < len(first) else rng.choices(extra, weights=weights)[0]
        hold = _hold(kind, rng, timing)
        step = (0.0 if overlap else hold) + rng.uniform(*_GAP[gap]) * hb
        name = "worker_kill" if kind == "long_kill" else kind
        node = rng.choice(nodes) if name.startswith("worker") else ""
        if n >= len(first) and at + hold > duration:
            return out
        out.append(Fault(round(at, 3), name, node, round(hold, 3)))
        at += step


def foreign_times(seed: int, duration: float, timing: Timing = TIMING) -> list[float]:
    """When someone else commits: bursts of one to three commits a few tens of ms apart,
    so some land between the broker reading the head and moving the ref."""
    rng = random.Random(f"gavel-chaos/foreign/{seed}")
    out: list[float] = []
    at = rng.uniform(1, 3) * timing.heartbeat_s
    while at < duration or not out:
        burst = at
        for _ in range(rng.randint(1, 3)):
            out.append(round(burst, 3))
            burst += rng.uniform(0.01, 0.08)
        at += rng.uniform(3, 8) * timing.heartbeat_s
    return out


def submissions(seed: int, duration: float, timing: Timing = TIMING) -> list[Submission]:
    """About one submission a heartbeat, two in three of them sleepers."""
    rng = random.Random(f"gavel-chaos/submit/{seed}")
    out: list[Submission] = []
    at = 0.0
    while at < duration:
        out.append(Submission(round(at, 3), f"chaos-{seed}-{len(out):04d}", rng.random() < 2 / 3))
        at += rng.uniform(0.3, 1.5) * timing.heartbeat_s
    return out


def room(subs: Sequence[Submission], workers: int) -> Room:
    """Each node's declared capacity (rule 3): every sleeper, twice over, on the nodes left
    with one frozen and one down, and never less than a small machine's 8 cpu / 8 GiB."""
    sleepers = sum(s.long for s in subs)
    left = max(1, workers - 2)
    cpu = max(8.0, math.ceil(2 * sleepers * SLEEPER.cpu / left))
    memory = max(8192, 1024 * math.ceil(2 * sleepers * SLEEPER.memory_mb / left / 1024))
    return Room(cpu=cpu, memory_mb=memory)
