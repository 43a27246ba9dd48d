"""Submissions: a `submit` of one instance or of many (a batch array), made, committed and
answered.

Rules:
1. A submission makes and encodes its records in slices of `SUBMIT_SLICE`, with the loop's
   other work between them, before it queues for its commit (`Change.ready`): a commit of
   large submissions encoded in one go holds the loop for all of it, while open bid rounds
   wait (docs/performance.md).
2. A submission lands in commits of at most `SUBMIT_COMMIT` instances, in index order, each
   queued once the one before it landed: between them the broker serves the API, auctions
   and heartbeats as at any other time (a commit's planning and adoption hold the loop in
   proportion to its size). Its answer waits for the last commit, durable: nobody is told
   of a submission before all of it is. An instance of a commit that landed is an ordinary
   instance and may be placed at once; the array it belongs to is not judged (released,
   ended) while the rest of it is still landing here.
3. A submission has one outcome. With an idempotency key (`SubmitRequest.key`) a request
   retried after a lost answer makes nothing new: if the key's submission landed - in this
   broker's life or an earlier one: every record carries the key, `State.keys` indexes it -
   the answer is the first one, the same instance ids (those retention has forgotten since
   included: the broker names N of them base-1 .. base-N); one still being committed is
   waited for; one that failed landed nothing (committer rule 4), so the retry submits
   afresh. Two requests with one key at once make one submission. A key met again with
   another spec, count or id is refused.
4. A submission cut short by a crash or a failover after some of its commits (rule 2) has
   its first instances, base-1 .. base-K, in git and no answer. Its client asks again with
   its key (`gavel.client` does, while no broker answers): the broker then commits the rest,
   base-K+1 .. base-N, as rule 2 does, and answers as if nothing happened. K is the highest
   index git holds: retention forgets only ended instances, oldest first, so the tail of a
   submission is never forgotten while its head is kept.
5. Each commit is a pure plan (`plan_submission`): the records it writes and its answer, or,
   when the view it plans on refuses them (the key landed another way, an id taken, a route
   another submission claimed), only the refusal's answer (`Planned.only`), carried out by
   the committer in commit order like any other effect. A submission refused before any
   commit is queued (`kind_naming_problem`, `Api._refused`, the admission caps, a reused
   key) is answered directly: it wrote nothing, so no commit of its own has to be durable
   before it is told.
6. The instances of a submission accepted (past rule 5's refusals) are `incoming` until the
   commit that holds them lands or is refused: work the auctioneer's tuner counts as
   waiting for a round (`broker.auctioneer` rule 12). A closed loop's next submissions are
   on their way to their commits for a second or more on a busy broker; without them the
   tuner saw half of what it was asked to place (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable

from gavel.broker.admission import Admission
from gavel.broker.arrays import task_record
from gavel.broker.context import Context
from gavel.broker.effects import Answer, Refuse, Wake
from gavel.broker.ledger.committer import Item, Planned
from gavel.broker.ledger.plan import View, submit
from gavel.broker.ledger.state import Ready, State, ready
from gavel.broker.routeowners import refusal_in as route_refusal_in
from gavel.shared.api import SubmitReply, SubmitRequest
from gavel.shared.arrays import run_of
from gavel.shared.ids import counted_ids
from gavel.shared.messages import ApiError, Message
from gavel.shared.reasons import Reason
from gavel.shared.spec import Spec

__all__ = ["SUBMIT_COMMIT", "SUBMIT_SLICE", "Submissions", "landed", "plan_submission"]

#: Records a submission makes and encodes between two turns of the loop (rule 1): a slice
#: short enough that a bid reply waiting behind it is not held up for long.
SUBMIT_SLICE = 128
#: Instances of one submission in one commit (rule 2): planning and adopting a commit of
#: this many holds the loop for about a tenth of a second, and each commit wakes a pass of
#: the auctioneer over every waiting instance, so fewer, larger commits land a large
#: submission sooner (docs/performance.md).
SUBMIT_COMMIT = 5_000


class Submissions:
    def __init__(self, ctx: Context, *, refused: Callable[[Spec], Message | None],
                 admission: Admission, landing: set[str],
                 chunk: int = SUBMIT_COMMIT) -> None:
        self.ctx = ctx
        self._refused = refused  # why no instance of a spec can be accepted at all
        self.admission = admission  # the caps on counts
        self.chunk = chunk
        #: Keyed submissions on their way to a commit, by key (rule 3): done when settled.
        self._keyed: dict[str, asyncio.Future[None]] = {}
        #: The arrays whose submission is still landing here (rule 2): not judged yet.
        self.landing = landing
        #: Rule 6: instances accepted whose commit has not landed yet.
        self.incoming = 0

    async def submit(self, req: SubmitRequest) -> Message:
        if not req.key:
            return await self._submit(req, req.instance_id or
                                      f"{req.spec.name}-{uuid.uuid4().hex[:6]}", 0)
        while (first := self._keyed.get(req.key)) is not None:  # rule 3: one at a time
            await asyncio.shield(first)
        settled = self._keyed[req.key] = asyncio.get_running_loop().create_future()
        try:
            landed, base, have = self._landed(req)
            if landed is not None:
                return landed
            return await self._submit(req, base, have)
        finally:
            del self._keyed[req.key]
            settled.set_result(None)

    def _landed(self, req: SubmitRequest) -> tuple[Message | None, str, int]:
        """Rules 3 and 4 on the ledger's state now."""
        return landed(self.ctx.ledger.state(), req,
                      req.instance_id or f"{req.spec.name}-{uuid.uuid4().hex[:6]}")

    async def _submit(self, req: SubmitRequest, base: str, have: int) -> Message:
        spec = req.spec
        ids = counted_ids(base, req.count)
        refused = self._refused(spec) or self.admission.submitted(spec, len(ids) - have)
        if refused is not None:
            return refused
        array = base if len(ids) > 1 else ""
        left = len(ids) - have
        self.incoming += left  # rule 6
        try:
            made: list[Ready] = []
            for at in range(have, len(ids), SUBMIT_SLICE):  # rule 1, before the first commit:
                if at > have:  # between commits the loop is not yielded to again and again
                    await asyncio.sleep(0)
                made += [ready(task_record(iid, spec, req.key, array, k))
                         for k, iid in enumerate(ids[at:at + SUBMIT_SLICE], at + 1)]
            if array:
                self.landing.add(array)
            for start in range(have, len(ids), self.chunk):  # rule 2
                end = min(start + self.chunk, len(ids))
                got = await self._commit(req, ids, start, end,
                                         made[start - have:end - have], fresh=start == 0)
                left -= end - start
                self.incoming -= end - start
                if got is not None:
                    return got
        finally:
            self.landing.discard(array)
            self.incoming -= left
        return SubmitReply.of(ids)

    async def _commit(self, req: SubmitRequest, ids: list[str], start: int, end: int,
                      made: list[Ready], *, fresh: bool) -> Message | None:
        """One commit of `ids[start:end]` (`made`): None once it is durable, else why it
        failed."""
        done: asyncio.Future[Message | None] = asyncio.get_running_loop().create_future()
        plan = functools.partial(plan_submission, req=req, ids=ids, start=start, end=end,
                                 made=made, fresh=fresh, done=done)
        self.ctx.committer.submit(Item(plan=plan, retry=False, gave_up=[Refuse(done)]))
        return await done


def landed(state: State, req: SubmitRequest, fresh: str) -> tuple[Message | None, str, int]:
    """Rules 3 and 4: the first answer for a key whose submission landed whole; else None,
    the base its ids are named from (`fresh` when the key made nothing yet) and how many of
    them git holds already."""
    kept = state.submitted(req.key)
    if not kept:
        return None, fresh, 0
    if req.count == 1:
        ids, first, base = kept, req.instance_id, kept[0]
    else:  # named base-1 .. base-N: those retention forgot since are named again
        base = kept[0].rpartition("-")[0]
        ids = counted_ids(base, req.count)
        first = f"{req.instance_id}-1" if req.instance_id else ""
    if state.instances[kept[0]].spec != req.spec or len(ids) != req.count \
            or not set(kept) <= set(ids) or (first and ids[0] != first):
        return ApiError(error=f"{Reason.KEY_REUSED}: {req.key} made {kept[0]}"
                              + (f" .. {kept[-1]}" if len(kept) > 1 else "")), base, 0
    have = max(run_of(iid)[0] for iid in kept) if req.count > 1 else 1
    if have < req.count:  # rule 4: cut short; the rest goes now
        return None, base, have
    return SubmitReply.of(ids), base, have


def plan_submission(view: View, *, req: SubmitRequest, ids: list[str], start: int, end: int,
                    made: list[Ready], fresh: bool, done: asyncio.Future[Message | None]
                    ) -> Planned:
    """Rule 5: one commit of `ids[start:end]` (`made`), answered None once durable; or, when
    the view refuses it, only that answer."""
    spec = req.spec
    if fresh and req.key and view.state.keys.get(req.key):  # landed another way
        got = landed(view.state, req, "")[0]
        return Planned.only(Answer(done, got or ApiError(error=Reason.KEY_REUSED)))
    records = [rec for rec, _, _ in made]
    taken = [r.instance_id for r in records if view.instance(r.instance_id) is not None]
    if taken:
        return Planned.only(Answer(done, ApiError(error=f"{Reason.DUPLICATE}: {taken[0]}")))
    owned = route_refusal_in(view, spec)  # another submit's claim may have landed
    if owned:
        return Planned.only(Answer(done, ApiError(error=owned)))
    for r in records:
        submit(view, r)
    view.change.ready.update((got[0].instance_id, got) for got in made)
    line = f"submit {ids[0]}" if len(ids) == 1 else \
        f"submit {end - start} instances of {spec.name}: {ids[start]} .. {ids[end - 1]}"
    if len(ids) > end - start:
        line += f" ({end} of {len(ids)})"
    return Planned(lines=[line], effects=[Answer(done, None), Wake()])
