"""The broker's service verbs: deploy, service, services, scale, stop, rollback.

Rules:
1. A deploy is refused with one sentence unless its spec is a service, and like any
   submission when its spec cannot be honoured (`Api._refused`); the rest is
   `broker.deploys`.
2. Every answer about a service is its record in git and its live replicas as `status`
   shows them (not terminal), counted per version; a replica being cancelled counts for
   none. A name gavel does not know is `Reason.UNKNOWN_SERVICE`.
3. An answer lists at most `REPLICAS_SHOWN` replicas of a service (the counts per version
   cover them all, `replicas_total` says how many live): a service of a hundred thousand
   replicas is still an answer the server's max payload lets through; `status` pages them.
4. A system job's answer names its nodes that wait at the cluster cap, each with the
   submit's refusal (`broker.systems` rule 7).
"""

from __future__ import annotations

from collections.abc import Callable

from gavel.broker.context import Context
from gavel.broker.deploys import Deploys
from gavel.broker.systems import job_nodes
from gavel.shared.api import (
    DeployRequest,
    InstanceStatus,
    RollbackRequest,
    ScaleRequest,
    ServiceReply,
    ServiceRequest,
    ServicesReply,
    ServicesRequest,
    ServiceStatus,
    StopServiceRequest,
    VersionStatus,
)
from gavel.shared.messages import ApiError, Message
from gavel.shared.messages import Health as InstanceHealth
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord, ServiceRecord
from gavel.shared.spec import Spec

__all__ = ["REPLICAS_SHOWN", "ServiceVerbs"]

#: Rule 3.
REPLICAS_SHOWN = 100


class ServiceVerbs:
    def __init__(self, ctx: Context, deploys: Deploys, *,
                 refused: Callable[[Spec], Message | None],
                 instance_status: Callable[[InstanceRecord], InstanceStatus],
                 over_cap: Callable[[str, int], Message | None],
                 capped: Callable[[str], dict[str, str]]) -> None:
        self.ctx = ctx
        self._capped = capped  # a system job's nodes waiting at the cluster cap, and why
        self._over_cap = over_cap  # `shared.admission`: a scale beyond the caps
        self.deploys = deploys
        self._refused = refused
        self._instance_status = instance_status

    async def deploy(self, req: DeployRequest) -> Message:
        spec = req.spec
        if not spec.service:
            return ApiError(error=f"{Reason.NOT_A_SERVICE}: {spec.name} (type = \"service\" "
                                  "makes it one; `gavel submit` runs a job)")
        if spec.name in self.ctx.ledger.state().periodic:  # status NAME names one thing
            return ApiError(error=f"{Reason.NAME_TAKEN}: {spec.name} is a periodic job")
        refused = self._refused(spec) or self.deploys.refused(spec.name) or \
            self._over_cap(spec.name, spec.count)
        if refused is not None:
            return refused
        return await self.deploys.deploy(spec, req.key, req.check_index)

    def service_status(self, svc: ServiceRecord) -> ServiceStatus:
        """A service and its live replicas: each one's state, node, version and health."""
        state = self.ctx.ledger.state()
        replicas = [self._instance_status(r) for r in state.replicas_of(svc.name)
                    if not r.state.terminal]
        replicas.sort(key=lambda r: (r.version, r.instance_id))
        versions: dict[int, VersionStatus] = {svc.version: VersionStatus(version=svc.version)}
        for r in replicas:
            if r.state == "cancelling":
                continue
            vs = versions.setdefault(r.version, VersionStatus(version=r.version))
            vs.replicas += 1
            vs.healthy += r.health == InstanceHealth.HEALTHY
        system = bool((spec := svc.spec_of(svc.version)) and spec.system)
        nodes = job_nodes(self.ctx, state, svc) if system else []
        up = {r.node_id for r in replicas if r.version == svc.version and r.state == "running"
              and r.health == InstanceHealth.HEALTHY}
        return ServiceStatus(name=svc.name, version=svc.version,
                             nodes=nodes[:REPLICAS_SHOWN],
                             waiting=[n for n in nodes if n not in up][:REPLICAS_SHOWN],
                             capped=dict(list(self._capped(svc.name).items())[:REPLICAS_SHOWN])
                             if system else {},
                             count=len(replicas) if system else svc.count, system=system,
                             stopped=svc.stopped, healthy_version=svc.healthy_version,
                             deployment=svc.deployment,
                             versions=[versions[v] for v in sorted(versions)],
                             replicas=replicas[:REPLICAS_SHOWN],
                             replicas_total=len(replicas))

    def _service_reply(self, name: str) -> Message:
        svc = self.ctx.ledger.state().services.get(name)
        if svc is None:
            return self.deploys.refused(name) or \
                ApiError(error=f"{Reason.UNKNOWN_SERVICE}: {name}")
        return ServiceReply(service=self.service_status(svc))

    async def service(self, req: ServiceRequest) -> Message:
        return self._service_reply(req.name)

    async def list_services(self, req: ServicesRequest) -> Message:
        state = self.ctx.ledger.state()
        return ServicesReply(services=[self.service_status(state.services[n])
                                       for n in sorted(state.services)])

    async def scale(self, req: ScaleRequest) -> Message:
        refused = self.deploys.refused(req.name) or self._over_cap(req.name, req.count)
        got = refused or await self.deploys.scale(req.name, req.count)
        return got or self._service_reply(req.name)

    async def stop(self, req: StopServiceRequest) -> Message:
        refused = self.deploys.refused(req.name)
        got = refused or await self.deploys.stop_service(req.name)
        return got or self._service_reply(req.name)

    async def rollback(self, req: RollbackRequest) -> Message:
        refused = self.deploys.refused(req.name)
        got = refused or await self.deploys.rollback(req.name, req.to_version)
        return got or self._service_reply(req.name)
