"""The chaos run's plan, all drawn from the seed: which faults, when, on which node, for how
long; when someone else commits; what is submitted when. Pure functions of the seed — the
same seed gives the same plan (a test says so); when it lands depends on the machine.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from gavel.shared.messages import Spec
from gavel.shared.timing import FAST_FACTOR, Timing

__all__ = ["BLIP", "FAULTS", "KINDS", "SLEEPER", "STRATEGIES", "TIMING", "Fault", "Submission",
           "foreign_times", "node_ids", "schedule", "submissions"]

KINDS = ("broker_kill", "nats_restart", "worker_kill", "worker_freeze")
FAULTS = (*KINDS, "foreign_commit")
STRATEGIES = ("least-loaded", "binpack", "spread", "headroom")
#: The run always uses fast timers; schedules are drawn in these units.
TIMING = Timing().scaled(FAST_FACTOR)
SLEEPER = Spec(name="sleeper", command=["sleep", "3600"], cpu=0.05, memory_mb=16)
BLIP = Spec(name="blip", command=["sh", "-c", "exit 0"], cpu=0.05, memory_mb=16)


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


def node_ids(workers: int) -> list[str]:
    return [f"node-{i + 1}" for i in range(workers)]


def schedule(seed: int, duration: float, nodes: Sequence[str],
             timing: Timing = TIMING, overlap: bool = False) -> list[Fault]:
    """The faults, in order: each process fault once (in a seeded order), then seeded picks
    while they fit in `duration`. By default one fault at a time: each ends (restart, thaw)
    before the next, so a broker restart never resets the clock of a freeze. With `overlap`
    the next fault starts a few heartbeats after the previous one *started*. A worker
    fault's node is the seeded one unless it holds nothing then (see `Chaos._target`)."""
    rng = random.Random(f"gavel-chaos/faults/{seed}")
    hb, offline = timing.heartbeat_s, timing.offline_s
    first = list(KINDS)
    rng.shuffle(first)
    out: list[Fault] = []
    at = 2 * hb
    while True:
        n = len(out)
        kind = first[n] if n < len(first) else rng.choices(KINDS, weights=(3, 2, 3, 1))[0]
        node = rng.choice(nodes) if kind.startswith("worker") else ""
        if kind == "broker_kill":
            hold = rng.uniform(0.2, 2.0) * hb
        elif kind == "nats_restart":
            hold = rng.uniform(0.5, 2.0) * hb
        elif kind == "worker_kill":  # a third stay down past offline: re-placed, then fenced
            hold = (offline + rng.uniform(1, 3) * hb if rng.random() < 1 / 3
                    else rng.uniform(0.5, 3.0) * hb)
        else:
            hold = offline + rng.uniform(3, 5) * hb
        if n >= len(first) and at + hold > duration:
            return out
        out.append(Fault(round(at, 3), kind, node, round(hold, 3)))
        at += (0.0 if overlap else hold) + rng.uniform(1.5, 4.0) * hb


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
    rng = random.Random(f"gavel-chaos/submit/{seed}")
    out: list[Submission] = []
    at = 0.0
    while at < duration:
        out.append(Submission(round(at, 3), f"chaos-{seed}-{len(out):04d}", rng.random() < 0.75))
        at += rng.uniform(0.15, 0.65) * timing.heartbeat_s
    return out
