"""The broker's request/reply API over NATS: submit, status, why, events, stats, tune (the
auctioneer's settings: `broker.auctioneer` rule 13), cancel, plan
(`broker.planner`: a dry run of a submission or deploy); the
node verbs: nodes, drain, and endpoints (what a gateway routes to: `broker.nodeapi`); and the
service verbs: deploy, service, services, scale, stop, rollback (`broker.serviceapi`,
`broker.deploys`).

Rules:
1. One decoder per verb; a request that does not decode, or that cannot be honoured, gets
   `ApiError` with one sentence — the broker never leaves a client waiting on garbage.
2. Requests are served side by side: a submit, cancel or drain waits for its commit, and a
   subscription serves its messages one after another, so serving each in the subscription's
   callback would let one client's commit hold up every other client's request of that verb
   (many clients submitting at once would get one submit per commit, never a group commit of
   theirs). Each request runs on a task of its own, up to `MAX_IN_FLIGHT`; past that the
   subscription waits for the request in hand (back-pressure: NATS holds the rest).
3. A submission is `broker.submissions`': its records made in slices, committed in chunks
   of bounded size, answered once all of it is durable, one outcome per idempotency key; a
   refusal its commit's plan finds is that plan's effect, one found before anything is
   queued (the checks here) is answered at once (`broker.submissions` rule 5).
4. (Rules 3 and 4 of `broker.submissions`: a keyed retry makes nothing new, and resumes a
   submission cut short.)
5. A verb is its subscription's, never read back from the message: the subject a message
   carries need not be the one it was heard on (`shared.subjects` rule 3). Each verb's
   `transport.inbound.Door` counts and drops what is no request of gavel's (a JetStream
   delivery, flow control, a heartbeat, headers) and any request without a reply subject
   or with one outside its operator's own inbox (``_INBOX.`` for ``gavel.api.<verb>``,
   ``_GAVEL_OP.<name>.`` for ``gavel.api.<verb>.<name>``): such a request is never served
   and never answered.
6. Status and nodes answers name the leading broker, its epoch and since when; a broker that
   no longer leads (`broker.ha`) answers nothing more: its client hears no answer, or no
   responders, and asks again (a submission with its key: rule 4).
7. An answer leaves on the connection its request came in on. On a NATS cluster the
   client's server tells each other server of the client's reply subscription on a route of
   its own, while the request travels on the route to this connection's server: behind the
   interest on that one route, the answer always finds it; from another connection, on a
   third server, it raced the interest there and could be dropped as unwanted (the
   client's first request went unanswered).
8. `status` of every instance comes in pages within the max payload (`broker.views` rule 3).
9. Who asks is the subject's: ``gavel.api.<verb>`` is the shared operator's, and
   ``gavel.api.<verb>.<name>`` operator name's, the server holding each named operator to its
   own name and its role's verbs (`transport.identity` rule 7). Each request that changes
   something is logged with who asked, and one taken for an instance or a service is a
   ``requested`` event of it naming the verb and the operator, kept in the history.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
import psutil
from nats.aio.msg import Msg

from gavel.broker.admission import Admission
from gavel.broker.arrays import array_status, cancel_array
from gavel.broker.auctioneer import Auctioneer
from gavel.broker.context import Context
from gavel.broker.deploys import Deploys
from gavel.broker.mirror import Mirror
from gavel.broker.nodeapi import NodeVerbs
from gavel.broker.periodic import Periodic, status_of, summary
from gavel.broker.planner import Planner
from gavel.broker.promises import Promises
from gavel.broker.routeowners import refusal as route_refusal
from gavel.broker.serviceapi import ServiceVerbs
from gavel.broker.services import Services
from gavel.broker.submissions import Submissions
from gavel.broker.views import Views
from gavel.shared import subjects
from gavel.shared.affinity import warnings
from gavel.shared.api import (
    CancelReply,
    CancelRequest,
    DeployReply,
    DeployRequest,
    DrainRequest,
    EndpointsRequest,
    EventsReply,
    EventsRequest,
    NodesRequest,
    PeriodicJobsReply,
    PeriodicJobsRequest,
    RollbackRequest,
    ScaleRequest,
    ServiceRequest,
    ServicesRequest,
    StatsReply,
    StatsRequest,
    StatusReply,
    StatusRequest,
    StopServiceRequest,
    SubmitReply,
    SubmitRequest,
    TuneReply,
    TuneRequest,
    WhyReply,
    WhyRequest,
    kind_naming_problem,
)
from gavel.shared.messages import ApiError, EventType, Message
from gavel.shared.planning import PlanRequest
from gavel.shared.reasons import Reason
from gavel.shared.roles import READ_VERBS
from gavel.shared.spec import Spec
from gavel.transport.inbound import Door, Guard
from gavel.transport.tasks import Tasks

__all__ = ["Api"]

_enc = msgspec.msgpack.Encoder()
Handler = Callable[[Any], Awaitable[Message]]
#: Requests served at once (rule 2).
MAX_IN_FLIGHT = 1024


class Api:
    def __init__(self, ctx: Context, *, auctioneer: Auctioneer, promises: Promises,
                 services: Services, deploys: Deploys, mirror: Mirror,
                 secrets: Mapping[str, str], ended_max: int, admission: Admission,
                 periodic: Periodic, capped: Callable[[str], dict[str, str]],
                 landing: set[str] | None = None) -> None:
        self.ctx = ctx
        self.periodic = periodic  # periodic jobs: their submit, status and cancel
        self.admission = admission  # the caps on counts
        self.auctioneer = auctioneer
        self.promises = promises
        self.services = services
        self.deploys = deploys
        self.mirror = mirror
        #: The names submissions may ask for (values are resolved only into awards).
        self.secrets = secrets
        self.ended_max = ended_max
        #: This process, whose RSS `stats` reports: made once (making one reads its start
        #: time from /proc, and `gavel bench` asks for stats four times a second).
        self._process = psutil.Process()
        #: The connection the requests come in on and their answers leave on (rule 7).
        self.nc: Any = None
        #: Requests being served (rule 2); a reference keeps each task alive.
        self._serving = Tasks("api", ctx.log)  # the requests being answered (rule 2)
        self.submissions = Submissions(ctx, refused=self._refused, admission=admission,
                                       landing=set() if landing is None else landing)
        auctioneer.incoming = lambda: self.submissions.incoming  # its rule 12: still landing
        self.views = Views(ctx, auctioneer, promises)
        self.service_verbs = ServiceVerbs(ctx, deploys, refused=self._refused,
                                          instance_status=self.views.instance_status,
                                          over_cap=self.admission.over_cap, capped=capped)
        self.node_verbs = NodeVerbs(ctx, auctioneer, promises, self.views, self._leader)
        self.planner = Planner(ctx, auctioneer, refused=self._plan_refused,
                               instance_status=self.views.instance_status)
        kinds: dict[str, tuple[type[Any], Handler]] = {
            "submit": (SubmitRequest, functools.partial(self._warned, self.submit)),
            "status": (StatusRequest, self.status),
            "nodes": (NodesRequest, self.node_verbs.nodes),
            "why": (WhyRequest, self.why),
            "events": (EventsRequest, self.events),
            "stats": (StatsRequest, self.stats),
            "tune": (TuneRequest, self.tune),
            "cancel": (CancelRequest, self.cancel),
            "drain": (DrainRequest, self.node_verbs.drain),
            "endpoints": (EndpointsRequest, self.node_verbs.endpoints),
            "deploy": (DeployRequest, functools.partial(self._warned,
                                                        self.service_verbs.deploy)),
            "service": (ServiceRequest, self.service_verbs.service),
            "services": (ServicesRequest, self.service_verbs.list_services),
            "scale": (ScaleRequest, self.service_verbs.scale),
            "stop": (StopServiceRequest, self.service_verbs.stop),
            "rollback": (RollbackRequest, self.service_verbs.rollback),
            "periodic": (PeriodicJobsRequest, self.periodic_jobs),
            "plan": (PlanRequest, self.planner.plan),
        }
        #: Per verb: its guard (rules 1 and 5) and its handler.
        self.verbs: dict[str, tuple[Guard[Any], Handler]] = {
            verb: (Guard(f"{verb} request", type_, ctx.rejects, door=Door(
                ctx.rejects, _subjects(verb), what=f"{verb} request",
                inbox=_operators, owner=_operator)), handler)
            for verb, (type_, handler) in kinds.items()}

    async def start(self, nc: Any) -> None:
        """One subscription per verb, each bound to its verb (rule 5), on `nc`, which
        answers them too (rule 7)."""
        self.nc = nc
        for verb in self.verbs:
            for subject in _subjects(verb):
                await nc.subscribe(subject, cb=self._handler(verb))

    def _handler(self, verb: str) -> Callable[[Msg], Awaitable[None]]:
        async def handle(msg: Msg) -> None:
            await self._handle(verb, msg)
        return handle

    async def _handle(self, verb: str, msg: Msg) -> None:
        """Rule 2: each request on a task of its own, while there is room."""
        if len(self._serving) >= MAX_IN_FLIGHT:
            await self._serve(verb, msg)
            return
        self._serving.spawn(self._serve(verb, msg), name=verb)

    async def _serve(self, verb: str, msg: Msg) -> None:
        guard, handler = self.verbs[verb]
        request = guard(msg)
        answer_to, refused = guard.reply, guard.refused  # before any other request's turn
        if not answer_to:  # not gavel's, or no answer may go where it asks (rule 5)
            return
        if request is None:
            reply: Message = ApiError(error=refused)
        else:
            if verb not in READ_VERBS:  # who changed what: the subject names them (rule 9)
                self.ctx.log.info("%s request from %s", verb, _operator(msg.subject))
            try:
                reply = await handler(request)
                if verb not in READ_VERBS and not isinstance(reply, ApiError):
                    self._asked(verb, request, reply, msg.subject)
            except Exception as exc:  # an API bug must not kill the broker
                self.ctx.rejects.count(f"failed {verb} request", msg.subject,
                                       _operator(msg.subject))
                reply = ApiError(error=f"{verb} failed: {exc}")
        if not self.ctx.leader.leading():
            return  # rule 6: no longer the leader; the client asks again
        try:
            await self.nc.publish(answer_to, _enc.encode(reply))  # rule 7
        except Exception as exc:  # the connection went: the client will time out
            self.ctx.log.warning("could not answer a %s request: %s", verb, exc)

    def _asked(self, verb: str, request: Any, reply: Any, subject: str) -> None:
        """Rule 9's event, on what the request named (the submission's id, the instance, the
        service)."""
        spec = getattr(request, "spec", None)
        for value in (getattr(reply, "instance_id", ""), getattr(request, "instance_id", ""),
                      getattr(request, "name", ""), getattr(spec, "name", "")):
            if isinstance(value, str) and value:
                self.ctx.events.emit(value, EventType.REQUESTED,
                                     detail=f"{verb} by {_operator(subject)}")
                return

    def close(self) -> None:
        self._serving.cancel()

    # -- verbs ---------------------------------------------------------------------------
    async def submit(self, req: SubmitRequest) -> Message:
        if named := kind_naming_problem(req.spec, req.instance_id, req.count):
            return ApiError(error=named)
        if req.spec.system:  # intent is a record of its own, as a service's (broker.systems)
            got = await self.service_verbs.deploy(DeployRequest(spec=req.spec, key=req.key))
            return SubmitReply(instance_id=got.name) if isinstance(got, DeployReply) else got
        if req.spec.schedule is not None:  # intent is its record (broker.periodic)
            return self._refused(req.spec) or await self.periodic.submit(req.spec)
        return await self.submissions.submit(req)

    async def _warned(self, handler: Handler, req: SubmitRequest | DeployRequest) -> Message:
        """`handler`'s answer, with a warning for each affinity no node carries the label of
        (`shared.affinity` rule 4): taken, but preferring nothing yet."""
        got = await handler(req)
        if req.spec.affinities and isinstance(got, SubmitReply | DeployReply):
            said = warnings(req.spec.affinities,
                            (hb.labels for hb in self.ctx.liveness.heartbeats.values()))
            if said:
                got = msgspec.structs.replace(got, warnings=said)
        return got

    def _plan_refused(self, spec: Spec) -> Message | None:
        """Why `spec` cannot be planned: what would refuse it at submit or deploy."""
        return self._refused(spec) or (self.deploys.refused(spec.name) if spec.service
                                       else None)

    async def stats(self, req: StatsRequest) -> Message:
        ctx = self.ctx
        auctioneer = self.auctioneer
        rounds = sorted(auctioneer.round_times)
        commits = sorted(ctx.committer.latencies)
        return StatsReply(
            placed_total=auctioneer.placed_total, instances=len(ctx.ledger.state().instances),
            nodes_healthy=len(ctx.liveness.eligible(ctx.now())),
            placed_now=len(ctx.ledger.state().where),
            auctions=auctioneer.auctions_total, bids_received=auctioneer.replies_total,
            commits=ctx.committer.commits, round_p50_ms=_pct(rounds, 50),
            round_p99_ms=_pct(rounds, 99), commit_p50_ms=_pct(commits, 50),
            commit_p99_ms=_pct(commits, 99),
            rss_mb=self._process.memory_info().rss / 2**20, kv_puts=self.mirror.puts,
            tuned_level=auctioneer.tuner.level, tuned_changes=auctioneer.tuner.changes,
            tuned_trace=[j.line() for j in auctioneer.tuner.trace])

    async def tune(self, req: TuneRequest) -> Message:
        """Pin or release the auctioneer's settings (`broker.auctioneer` rule 13), or only
        read them; the rounds of the settings replaced (or in force, only read)."""
        a = self.auctioneer
        if req.apply:
            gap_ms = req.commit_gap_ms
            round_s, rounds = a.retune(batch_max=req.batch_max, max_auctions=req.max_auctions,
                                       commit_gap_s=None if gap_ms is None else gap_ms / 1000)
        else:
            round_s, rounds = list(a.since_tuned), a.since_tuned_total
        t = a.tuner
        pins = (("batch_max", t.pinned_batch_max), ("max_auctions", t.pinned_max_auctions),
                ("commit_gap_ms", t.pinned_gap_s))
        return TuneReply(
            batch_max=a.core.batch_max, max_auctions=a.core.max_auctions,
            commit_gap_ms=1000 * self.ctx.committer.gap_s,
            pinned=[name for name, value in pins if value is not None], level=t.level,
            changes=t.changes, round_ms=[1000 * s for s in round_s], rounds=rounds,
            placed_total=a.placed_total)

    def _refused(self, spec: Spec) -> ApiError | None:
        """Why no instance of `spec` can be accepted at all (None: it can)."""
        missing = [s for s in spec.secrets if s not in self.secrets]
        if missing:
            return ApiError(error=f"unknown secret {missing[0]!r}: it is not in the broker's "
                                  "secrets file")
        never = self._never_fits(spec.cpu, spec.memory_mb, len(spec.ports))
        if never:
            return ApiError(error=f"{Reason.NEVER_FITS}: {never}")
        if self.ctx.ledger.pinned:
            return ApiError(error=f"{Reason.PINNED} ({self.ctx.ledger.ref})")
        owned = route_refusal(self.ctx.ledger.state(), spec)
        return ApiError(error=owned) if owned else None

    def _never_fits(self, cpu: float, memory_mb: int, ports: int) -> str:
        caps = [hb.capacity for hb in self.ctx.liveness.heartbeats.values()]
        if not caps:
            return ""
        if all(cpu > c.cpu for c in caps):
            return f"asks {cpu:g} cpu, the largest node has {max(c.cpu for c in caps):g}"
        if all(memory_mb > c.memory_mb for c in caps):
            return (f"asks {memory_mb} MB memory, the largest node has "
                    f"{max(c.memory_mb for c in caps)} MB")
        if all(ports > c.ports for c in caps):
            return f"asks {ports} ports, the largest node offers {max(c.ports for c in caps)}"
        return ""

    def _unknown(self, iid: str) -> ApiError:
        keep, most = self.ctx.timing.retention_s, self.ended_max
        rules = ([f"{keep:g} s after it ended"] if keep > 0 else []) + (
            [f"once {most} newer ended ones are kept"] if most > 0 else [])
        hint = (f" (the record of an ended instance leaves the state tree {' or '.join(rules)}"
                "; git history keeps it)") if rules else ""
        return ApiError(error=f"{Reason.UNKNOWN_INSTANCE}: {iid}{hint}")

    async def status(self, req: StatusRequest) -> Message:
        state = self.ctx.ledger.state()
        if req.instance_id:
            rec = state.instances.get(req.instance_id)
            if rec is None and (job := state.periodic.get(req.instance_id)) is not None:
                return status_of(state, job, self.periodic.now(), self._leader(),
                                 self.views.instance_status)
            if rec is None and state.arrays.get(req.instance_id):
                return array_status(self.ctx.ledger.state(), req, self.views.instance_status,
                                    self._leader()) or self._unknown(req.instance_id)
            if rec is None:
                return self._unknown(req.instance_id)
            return StatusReply(instances=[self.views.instance_status(rec)], **self._leader())
        if req.summary:  # the cluster in brief (`broker.views` rule 5)
            shown, counts, names = await self.views.summary(state.instances, state.ended,
                                                            self.nc)
            return StatusReply(instances=shown, total=len(state.instances), counts=counts,
                               by_name=names, **self._leader())
        out, more = self.views.status_page(state.instances, req.after, self.nc,
                                            state.head or "")
        return StatusReply(instances=out, next=more, total=len(state.instances),
                           **self._leader())

    async def periodic_jobs(self, _req: PeriodicJobsRequest) -> Message:
        state = self.ctx.ledger.state()
        now = self.periodic.now()
        return PeriodicJobsReply(jobs=[summary(state, state.periodic[n], now)[0]
                                       for n in sorted(state.periodic)])

    def _leader(self) -> dict[str, Any]:
        """Who answers (rule 6)."""
        lead = self.ctx.leader
        return {"leader": lead.broker_id, "epoch": lead.epoch, "leader_since": lead.since}

    async def why(self, req: WhyRequest) -> Message:
        rec = self.ctx.ledger.state().instances.get(req.instance_id)
        if rec is None:
            return self._unknown(req.instance_id)
        auctions = await asyncio.get_running_loop().run_in_executor(
            None, self.ctx.ledger.auctions_for, req.instance_id)
        recent = self.auctioneer.recent(req.instance_id)
        if recent is not None and all(a.auction_id != recent.auction_id for a in auctions):
            auctions.insert(0, recent)
        return WhyReply(instance=self.views.instance_status(rec), auctions=auctions)

    async def events(self, req: EventsRequest) -> Message:
        evs = [e for e in self.ctx.events
               if (not req.instance_id or e.instance_id == req.instance_id)
               and e.at >= req.since]
        return EventsReply(events=evs[-req.limit:] if req.limit > 0 else evs)

    async def cancel(self, req: CancelRequest) -> Message:
        if self.ctx.ledger.pinned:
            return ApiError(error=f"{Reason.PINNED} ({self.ctx.ledger.ref})")
        st = self.ctx.ledger.state()
        if req.instance_id not in st.instances and req.instance_id in st.periodic:
            return await self.periodic.cancel(req.instance_id)
        if req.instance_id not in st.instances and st.arrays.get(req.instance_id):
            return cancel_array(self.ctx.ledger.state(), self.promises, req.instance_id)
        try:
            state = self.promises.cancel(req.instance_id)
        except KeyError:
            return self._unknown(req.instance_id)
        return CancelReply(instance_id=req.instance_id, state=state)


def _subjects(verb: str) -> tuple[str, str]:
    """A verb's subjects: the shared operator's, and each named operator's (its name last:
    `shared.subjects` rule 4, the server holding each to its own)."""
    return subjects.API.format(verb=verb), subjects.API_AS.format(verb=verb, operator="*")


def _operators(subject: str) -> str:
    """Every API request is an operator's: it is answered under that operator's inbox."""
    return subjects.inbox_of(subjects.asker(subject, 3))


def _operator(subject: str) -> str:
    """Who asked, for the log: the operator its subject names."""
    return f"operator {subjects.asker(subject, 3) or '?'}"


def _pct(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile in milliseconds (0 when there is nothing to rank)."""
    if not sorted_values:
        return 0.0
    k = max(0, min(len(sorted_values) - 1, round(pct / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[k] * 1000.0
