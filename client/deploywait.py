"""The typed client's wait for a deploy's end - what `gavel deploy --wait` waits for.

Rules:
1. A deploy of version V succeeded while `count` replicas of V are healthy and no other
   version has a replica: a deployment recorded as succeeded is history (a stopped service
   started again keeps it).
2. It ended without success when it failed, was rolled back, was cancelled or replaced by
   another change, or the service was stopped: `Ended` with the sentence `gavel deploy
   --wait` prints, and the service's status.
3. As every wait of the client's (`gavel.client.jobwait` rule 3): each of the service's
   events is a reason to look again, it also looks every `POLL_S`, and past the timeout it
   is `TimedOut` with the status last seen.
"""

from __future__ import annotations

from gavel.client.jobwait import Client, Ended, _until
from gavel.shared.api import ServiceReply, ServiceRequest, ServiceStatus
from gavel.shared.reasons import Reason

__all__ = ["deployed", "verdict"]


def verdict(st: ServiceStatus, version: int) -> tuple[int, str] | None:
    """How a deploy of `version` ended, as an exit code (0 or 3) and a sentence; None while
    it runs (rules 1 and 2)."""
    dep = st.deployment
    if dep is not None and dep.from_version == version and dep.reason == Reason.ROLLED_BACK:
        return 3, (f"{st.name} version {version} was rolled back to version {dep.to_version}: "
                   f"{dep.detail or dep.reason}")
    if dep is not None and dep.to_version == version:
        match dep.state:
            case "succeeded" | "rolled-back":
                if st.stopped or not _whole(st, version):
                    return None if not st.stopped else (3, f"{st.name} was stopped")
                return 0, f"{st.name} version {version} deployed: {st.count} replicas healthy"
            case "failed":
                return 3, (f"deploy of {st.name} version {version} failed: {dep.reason}"
                           + (f" ({dep.detail})" if dep.detail else ""))
            case "cancelled":
                return 3, (f"the deploy of {st.name} version {version} was cancelled"
                           + (f": {dep.reason}" if dep.reason else ""))
        return None
    if st.version != version:
        return 3, f"the deploy of {st.name} version {version} was replaced by version {st.version}"
    if st.stopped:
        return 3, f"{st.name} was stopped"
    if _whole(st, version):
        return 0, f"{st.name} version {version} is running: {st.count} replicas healthy"
    return None


def _whole(st: ServiceStatus, version: int) -> bool:
    """`count` replicas of `version` are healthy and no other version has one (rule 1)."""
    mine = [v for v in st.versions if v.version == version]
    return bool(mine) and mine[0].healthy == st.count and \
        all(v.replicas == 0 for v in st.versions if v.version != version)


async def deployed(client: Client, name: str, version: int,
                   timeout: float | None) -> ServiceStatus:
    """Rules 1 to 3: the service's status once `version` of it is deployed."""
    async def look() -> tuple[ServiceStatus | None, ServiceStatus]:
        st = (await client.request("service", ServiceRequest(name=name),
                                   ServiceReply)).service
        said = verdict(st, version)
        if said is not None and said[0]:
            raise Ended(said[1], st)
        return (st if said is not None else None), st
    return await _until(client, name, timeout, f"version {version} not deployed", look)
