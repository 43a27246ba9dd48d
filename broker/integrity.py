"""Corrections: the broker commits what `broker.ledger.integrity` kept.

Rules:
1. Every pass of the broker's loop looks at the state's open disputes (an instance a tree
   someone else wrote listed where the broker had not placed it); each new one is logged at
   ERROR, naming the instance and every node file involved, and its correction goes to the
   group committer: the node files involved, written as the broker's state holds them, in a
   commit whose message says the same sentence.
2. The state already holds only the kept placement while the correction is on its way, so
   nothing waits for it: no award, no KV put, no capacity count sees the dropped copy.
3. A dispute is committed once (the same dispute stays the same object across re-reads); a
   correction that could not be written is tried again on a later pass. A pinned deployment
   writes nothing: the dispute is logged, and the state keeps the broker's placement.
4. The correction is a pure plan (`plan_correction`): the node files it rewrites, the
   disputes that closed meanwhile (sent afresh by the next pass), and one effect,
   `Corrected`, which the part notes once the commit is durable (`broker.effects`); the
   disputes that closed are noted by an effect too (`Uncorrected`, `plan_pass`): planning
   changes nothing of the part's.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from gavel.broker.context import Context
from gavel.broker.ledger.committer import Item, Planned
from gavel.broker.ledger.disputes import Dispute
from gavel.broker.ledger.plan import View, rewrite
from gavel.shared.reasons import Reason

__all__ = ["Corrected", "Integrity", "Uncorrected", "plan_correction", "plan_pass"]


@dataclass(frozen=True)
class Corrected:
    """The effect of a correction commit: these disputes' node files are rewritten."""

    disputes: tuple[Dispute, ...]


@dataclass(frozen=True)
class Uncorrected:
    """The correction of these disputes was given up: the next pass sends them again."""

    disputes: tuple[Dispute, ...]


def plan_correction(view: View,
                    disputes: list[Dispute]) -> tuple[Planned | None, list[Dispute]]:
    """Rule 4: rewrite the node files of the disputes still open in `view` as its state
    holds them; and the disputes no longer open as they were (the tree moved again)."""
    open_now = view.state.disputes
    gone = [d for d in disputes if open_now.get(d.instance_id) is not d]
    still = [d for d in disputes if open_now.get(d.instance_id) is d]
    nodes = sorted({n for d in still for n in d.rewrite})
    if not still or not rewrite(view, nodes):
        return None, gone
    return Planned(lines=[f"correct: {d.sentence()}" for d in still],
                   effects=[Corrected(tuple(still))]), gone


def plan_pass(view: View, disputes: list[Dispute]) -> Planned | None:
    """Rule 4's commit of a pass: `plan_correction`'s, and the disputes that closed
    meanwhile noted as not corrected (`Uncorrected`: the next pass sends what is open
    then afresh) - as the plan's only effect when nothing is left to correct."""
    planned, gone = plan_correction(view, disputes)
    if not gone:
        return planned
    if planned is None:
        return Planned.only(Uncorrected(tuple(gone)))
    planned.effects.append(Uncorrected(tuple(gone)))
    return planned


class Integrity:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        #: Disputes whose correction is queued or being written, by instance.
        self._sent: dict[str, Dispute] = {}
        self.corrected = 0
        ctx.committer.effects.on(Corrected, self._landed)
        ctx.committer.effects.on(Uncorrected, lambda e, _sha: self._failed(e.disputes))

    def watch(self) -> None:
        """One pass (rule 1)."""
        disputes = self.ctx.ledger.state().disputes
        if not disputes:
            return
        new = [d for iid, d in disputes.items() if self._sent.get(iid) is not d]
        if not new:
            return
        pinned = self.ctx.ledger.pinned
        for d in new:
            self._sent[d.instance_id] = d
            self.ctx.log.error("%s; %s", d.sentence(),
                               f"{Reason.PINNED}: the broker keeps it so in memory only"
                               if pinned else "correcting it in git",
                               extra={"instance": d.instance_id, "kept": d.kept,
                                      "listed": list(d.held)})
        if pinned:
            return  # rule 2 still holds: the state keeps only the broker's placement
        self.ctx.committer.submit(Item(plan=functools.partial(plan_pass, disputes=new),
                                       gave_up=[Uncorrected(tuple(new))], retry=False))

    def _landed(self, done: Corrected, sha: str) -> None:
        open_now = self.ctx.ledger.state().disputes
        for d in done.disputes:
            if open_now.get(d.instance_id) is d:
                del open_now[d.instance_id]
            if self._sent.get(d.instance_id) is d:
                del self._sent[d.instance_id]
            self.corrected += 1
        self.ctx.log.info("corrected %d placements someone else wrote, in commit %s",
                          len(done.disputes), sha[:12])

    def _failed(self, disputes: Sequence[Dispute]) -> None:
        for d in disputes:  # rule 3: the next pass sends it again
            if self._sent.get(d.instance_id) is d:
                del self._sent[d.instance_id]
