"""The service verbs of `gavel`: deploy (and deploy status), services, scale, stop, rollback,
and `status NAME` when NAME names a service. `gavel.cli.commands` dispatches to them.

Rules:
1. As every client verb: a table or ``--json``; exit 0 done, 1 unreachable, 2 bad input,
   3 refused, 4 unknown - and ``deploy --wait`` exits 3 with the reason when the deploy
   failed, was rolled back or was cancelled by another change. It says a version is
   deployed only while `count` replicas of it are healthy and no other version runs: a
   deployment recorded as succeeded is history (a stopped service started again keeps it).
2. `deploy` sends an idempotency key and asks again with it, up to `DEPLOY_TRIES` times,
   when the broker does not answer within `DEPLOY_TRY_S`: a deploy whose answer was lost is
   not made twice (and a spec equal to the running version changes nothing anyway).
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

import msgspec

from gavel.cli.specfile import SpecError, load_spec
from gavel.client import BrokerRefused, Client, ClientError, Ended, Retries, TimedOut
from gavel.client.deploywait import verdict
from gavel.shared.api import DeployReply, ServiceReply, ServiceStatus
from gavel.shared.errors import BadInput
from gavel.shared.messages import Spec
from gavel.shared.reasons import Reason
from gavel.shared.timing import Timing

__all__ = ["Refused", "deploy", "rollback", "scale", "service_status", "services", "stop"]

#: How long `deploy` waits for each answer, and how many times it asks (rule 2).
DEPLOY_TRY_S = Timing().answer_s
DEPLOY_TRIES = 3
R = TypeVar("R")


class Refused(Exception):
    """The broker answered, but no; or the deploy did not succeed: exit code 3."""


def _print_json(obj: object) -> None:
    print(msgspec.json.format(msgspec.json.encode(obj), indent=2).decode())


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


async def _ask(args: argparse.Namespace, ask: Callable[[Client], Awaitable[R]]) -> R:
    """One verb through the Python client (`gavel.client`), as any program asks it; the
    broker's no is `Refused`."""
    async with await Client.connect(args.nats, args.creds) as client:
        try:
            return await ask(client)
        except BrokerRefused as exc:
            raise Refused(str(exc)) from None


def _state(st: ServiceStatus) -> str:
    dep = st.deployment
    if st.stopped:
        return "stopped"
    if dep is not None and dep.state == "running":
        return "rolling back" if dep.reason == Reason.ROLLED_BACK else "deploying"
    if dep is not None and dep.state == "failed":
        return "deploy failed"
    return "running"


def _deployment_line(st: ServiceStatus) -> str:
    dep = st.deployment
    if dep is None:
        return "deployment: none"
    head = f"deployment: version {dep.from_version or '-'} -> {dep.to_version} {dep.state}"
    why = f"{dep.reason} ({dep.detail})" if dep.reason and dep.detail else dep.reason
    return head + (f": {why}" if why else "") + (f", started {dep.started_at}"
                                                  if dep.started_at else "") \
        + (f", ended {dep.ended_at}" if dep.ended_at else "")


def print_service(st: ServiceStatus, deployment: bool = False) -> None:
    """A service, its versions (with `deployment`) and its replicas, as tables."""
    head = f"system job {st.name}: version {st.version}, on {st.count} nodes" if st.system \
        else f"service {st.name}: version {st.version}, {st.count} replicas"
    print(f"{head}, {_state(st)}"
          + (f", last healthy version {st.healthy_version}" if st.healthy_version else ""))
    if deployment:
        print(_deployment_line(st))
        rows = [("VERSION", "REPLICAS", "HEALTHY")]
        rows += [(str(v.version), str(v.replicas), str(v.healthy)) for v in st.versions]
        _table(rows)
    replicas = [("INSTANCE", "VERSION", "STATE", "NODE", "HEALTH")]
    for r in st.replicas:
        health = r.health + (f" ({r.check})" if r.check else "")
        replicas.append((r.instance_id, str(r.version), r.state, r.node_id or "-",
                         health or "-"))
    if len(replicas) > 1:
        _table(replicas)
    more = st.replicas_total - len(st.replicas)
    if more > 0:
        print(f"and {more} more replicas (`gavel status` lists every instance)")
    for node, why in st.capped.items():
        print(f"{node}: waits for room: {why}")


async def service_status(args: argparse.Namespace, name: str) -> ServiceStatus | None:
    """The service `name`, or None when no service has that name (it may be an instance)."""
    try:
        reply = await _ask(args, lambda c: c.service(name))
    except Refused as exc:
        if str(exc).startswith(Reason.UNKNOWN_SERVICE):
            return None
        raise
    return reply.service


async def deploy(args: argparse.Namespace) -> int:
    target: list[str] = args.target
    if target[0] == "status" and len(target) == 2:
        return await deploy_status(args, target[1])
    if len(target) != 1:
        raise BadInput("deploy takes one spec file, or `status NAME`")
    try:
        spec = load_spec(Path(target[0]))
    except SpecError as exc:
        raise BadInput(str(exc)) from None
    if not spec.service:
        raise BadInput(f"{target[0]}: {Reason.NOT_A_SERVICE} (type = \"service\" makes it "
                       "one; `gavel submit` runs a job)")
    reply = await _deploy_once(args, spec, getattr(args, "check_index", None))
    for w in reply.warnings:
        print(f"gavel deploy: warning: {w}", file=sys.stderr)
    if not args.wait:
        if args.json:
            _print_json(reply)
        else:
            print(f"{reply.name}: version {reply.version}"
                  + ("" if reply.changed else " (unchanged)"))
        return 0
    return await _wait_deployed(args, reply)


async def _deploy_once(args: argparse.Namespace, spec: Spec,
                       check_index: int | None) -> DeployReply:
    """Rule 2: the deploy through the client, asked again with its key while the broker does
    not answer (not while none answers at all: that is said at once). A retry is answered
    what the first try was; by a broker that restarted meanwhile, it finds the version
    deployed and changes nothing."""
    def retrying(exc: ClientError) -> None:
        print(f"gavel deploy: {exc}; asking again with the same key", file=sys.stderr)

    return await _ask(args, lambda c: c.deploy(
        spec, key=uuid.uuid4().hex, check_index=check_index, on_retry=retrying,
        retries=Retries(try_s=DEPLOY_TRY_S, tries=DEPLOY_TRIES, failover=False)))


async def _wait_deployed(args: argparse.Namespace, reply: DeployReply) -> int:
    """``--wait``: the client's wait (`Client.wait_deployed`), its ends said as this command
    says them (rule 1)."""
    async with await Client.connect(args.nats, args.creds) as client:
        try:
            st = await client.wait_deployed(reply.name, reply.version, args.timeout or None)
        except BrokerRefused as exc:
            raise Refused(str(exc)) from None
        except Ended as exc:
            if args.json:
                _print_json(exc.status)
            raise Refused(str(exc)) from None
        except TimedOut:
            raise Refused(f"the deploy of {reply.name} version {reply.version} did not end "
                          f"within {args.timeout:g}s; see `gavel deploy status "
                          f"{reply.name}`") from None
    said = verdict(st, reply.version)
    if args.json:
        _print_json(st)
    elif said is not None:
        print(said[1])
    return 0


async def deploy_status(args: argparse.Namespace, name: str) -> int:
    reply = await _ask(args, lambda c: c.service(name))
    if args.json:
        _print_json(reply.service)
    else:
        print_service(reply.service, deployment=True)
    return 0


async def services(args: argparse.Namespace) -> int:
    reply = await _ask(args, lambda c: c.services())
    if args.json:
        _print_json(reply.services)
        return 0
    rows = [("SERVICE", "VERSION", "COUNT", "HEALTHY", "STATE", "DEPLOYMENT")]
    for st in reply.services:
        healthy = sum(v.healthy for v in st.versions)
        dep = st.deployment
        rows.append((st.name, str(st.version), str(st.count), str(healthy), _state(st),
                     f"{dep.from_version or '-'} -> {dep.to_version} {dep.state}"
                     if dep is not None else "-"))
    _table(rows)
    return 0


async def _change(args: argparse.Namespace, ask: Callable[[Client], Awaitable[ServiceReply]],
                  said: str) -> int:
    reply = await _ask(args, ask)
    if args.json:
        _print_json(reply.service)
    else:
        print(said)
    return 0


async def scale(args: argparse.Namespace) -> int:
    return await _change(args, lambda c: c.scale(args.name, args.count),
                         f"{args.name}: {args.count} replicas")


async def stop(args: argparse.Namespace) -> int:
    return await _change(args, lambda c: c.stop(args.name),
                         f"{args.name}: stopping every replica")


async def rollback(args: argparse.Namespace) -> int:
    reply = await _ask(args, lambda c: c.rollback(args.name, args.to))
    st = reply.service
    if args.json:
        _print_json(st)
    else:
        print(f"{st.name}: rolling back to version {st.version}")
    return 0
