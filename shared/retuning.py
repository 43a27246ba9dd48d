"""`gavel tune`'s request and reply (``gavel.api.tune``): the auctioneer's batch size, rounds
in flight and commit gap read, pinned or released on a running broker (`broker.auctioneer`
rule 13). `gavel.shared.api` names them with the other verbs' structs.

Rule: a value is bounded as the broker's config bounds it (`shared.tuning`'s `BATCH_MOST`,
`AUCTIONS_MOST`, `GAP_MS_MOST`), and a value given only to be read is refused: a request
that would change nothing must not look as if it pinned something.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from gavel.shared.messages import Message
from gavel.shared.tuning import AUCTIONS_MOST, BATCH_MOST, GAP_MS_MOST

__all__ = ["TuneReply", "TuneRequest"]


class TuneRequest(Message, tag="tune", kw_only=True):
    """Pin or release the auctioneer's batch size, rounds in flight and commit gap now
    (`gavel tune`), or only read them. Applied, the broker's tuner is replaced by a fresh one
    pinning what is given (`shared.tuning` rule 7), at its first level with nothing measured,
    as a broker started with those values would have it; every value None tunes all again.
    Rounds already in flight finish as they were opened. Not kept: a restarted broker, or a
    new leader (HA), starts from its config."""

    #: Pin these (None: the broker tunes it). With `apply` False nothing changes.
    batch_max: Annotated[int, msgspec.Meta(ge=1, le=BATCH_MOST)] | None = None
    max_auctions: Annotated[int, msgspec.Meta(ge=1, le=AUCTIONS_MOST)] | None = None
    commit_gap_ms: Annotated[float, msgspec.Meta(ge=0, le=GAP_MS_MOST)] | None = None
    #: False: only read the settings and the rounds since the last change.
    apply: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.apply and (self.batch_max is not None or self.max_auctions is not None
                               or self.commit_gap_ms is not None):
            raise ValueError("tune: values are only read with apply=false: apply them, or "
                             "leave them out")


class TuneReply(Message, tag="tune-reply", kw_only=True):
    """The auctioneer's settings after a `TuneRequest`, and what the settings it replaced
    (or, only read, the settings in force) did."""

    #: The settings in force now (after the change, if one was applied).
    batch_max: int
    max_auctions: int
    commit_gap_ms: float
    #: Which of "batch_max", "max_auctions", "commit_gap_ms" are pinned now (in that order).
    pinned: list[str]
    #: The tuner's level now and its changes since it was made.
    level: int
    changes: int
    #: The bid rounds closed since the last change (the settings this request replaced, when
    #: applied; the settings in force, when only read), in ms, oldest first, at most the
    #: broker's ROUNDS_KEPT (the oldest dropped), and how many closed in all.
    round_ms: list[float]
    rounds: int
    #: Awards the broker has made since it started (StatsReply.placed_total's count), so a
    #: caller can tell what each setting placed.
    placed_total: int
