"""What a broker is started with, as one value.

Rules:
1. Every setting of a broker is a field here, with its default: a broker is `Broker(Config(
   nats_url=..., state_dir=...))`, and what varies between the daemon, the bench, HA's
   leaderships and the tests is a `Config` they build, print, compare or `replace`.
2. Settings only: the collaborators a broker is handed (its `Leadership`, a shared `Metrics`,
   the maker of its pusher) are arguments of `Broker` itself, never fields here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from gavel.shared.admission import DEFAULT_CAPS, Caps
from gavel.shared.reauction import Settings
from gavel.shared.timing import Timing

__all__ = ["Config"]


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Config:
    nats_url: str
    #: The state repository is `state_dir/state.git`; `ref` is the branch the broker writes.
    state_dir: Path
    ref: str = "refs/heads/main"
    timing: Timing = field(default_factory=Timing)
    #: Secret values by name, handed to the instances whose spec names them.
    secrets: Mapping[str, str] = field(default_factory=dict)
    #: The broker's clock (monotonic, injectable) and the wall clock its records stamp.
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], datetime] = _utc_now
    #: The auctioneer: awards per batch, sampled auctions (d nodes asked; None: all),
    #: its seed, auctions open at once, and how long a batch waits for more requests.
    #: `batch_max`, `max_auctions` and `commit_gap_s` None: tuned to the load
    #: (`shared.tuning`); a value pins it.
    batch_max: int | None = None
    sample_d: int | None = None
    seed: int | None = None
    max_auctions: int | None = None
    batch_wait_s: float = 0.0
    #: The committer: the least gap between commits, and its writer ("process" or "thread").
    commit_gap_s: float | None = None
    writer: str = "process"
    #: Who writes blobs and trees ("packs" or "libgit2": `Ledger` rule 9), and whether the
    #: after-commit work runs in slices (committer rule 3): the simpler alternatives are
    #: here to measure what each mechanism buys (`python -m gavel.bench.complexity`).
    objects: str = "packs"
    after_slices: bool = True
    #: Retention: ended instances kept; the caps on counts admission holds.
    ended_max: int = 100_000
    caps: Caps = DEFAULT_CAPS
    #: NATS: extra options of both connections, and how long the first connect keeps trying
    #: ("timing": this config's `timing.connect_s`; None: for ever, as the daemon does;
    #: `first_connect_s` says which).
    nats_options: Mapping[str, Any] = field(default_factory=dict)
    connect_wait_s: float | Literal["timing"] | None = "timing"
    #: Who this broker is, and the replicas of the JetStream buckets it creates.
    broker_id: str = "broker"
    kv_replicas: int = 1
    #: Re-auction of running replicas (`broker.reauction`); None: off.
    rebalance: Settings | None = None

    @property
    def first_connect_s(self) -> float | None:
        """How long the first connect to NATS keeps trying (None: for ever)."""
        return self.timing.connect_s if self.connect_wait_s == "timing" else self.connect_wait_s
