"""How the API shows an instance: its live state and health beside what git holds.

Rules:
1. A pending instance that a node file holds is cancelling while its cancel is on its way;
   else `UNKNOWN` while its node is not heard (unreachable or offline: what runs there is
   not known, as Nomad says of a disconnected node's allocations), with the reason and the
   node's health as its detail; else what its node last reported (`Promises.live`, or what
   its newest stored heartbeat said when this broker started, `Promises.recalled`), or
   placed. A waiting one is scheduled while an auction holds it; anything else is the
   record's own state.
2. A placed instance's health is its node's last word (`Promises.health`, else the
   recalled heartbeat's); without one, an instance running with no checks is healthy and
   any other unknown. An instance in `UNKNOWN` has no health.
3. Every instance's status is shown a page at a time (`broker.api` rule 8): in id order
   after a given id, as many as encode within a byte budget (at least one) and at most
   `STATUS_PAGE_MAX`. The ids are put in order once per commit, not once per page: a
   hundred thousand instances are some forty pages.
4. What a placed instance uses is what its node's last heartbeat measured of it.
5. The summary (`StatusRequest.summary` without an id) counts every instance by its state
   (rule 1) and name, in slices of `SUMMARY_SLICE` with the loop's other work between them,
   and lists at most `SUMMARY_SHOWN`: the live ones in id order, then the latest ended, within
   the same byte budget as a page. A dashboard's refresh at a hundred thousand instances is
   one answer of bounded size, not every page.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from gavel.broker.auctioneer import Auctioneer
from gavel.broker.context import Context
from gavel.broker.promises import Promises
from gavel.shared.api import SUMMARY_SHOWN, InstanceStatus
from gavel.shared.health import Health as NodeHealth
from gavel.shared.lifecycle import PENDING
from gavel.shared.messages import Health as InstanceHealth
from gavel.shared.messages import Heartbeat, InstanceReport, InstanceState
from gavel.shared.reasons import Reason
from gavel.shared.records import InstanceRecord

__all__ = ["STATUS_PAGE_MAX", "UNKNOWN", "Views"]

#: Rule 1's state of an instance whose node is not heard.
UNKNOWN = "unknown"
#: Rule 3.
STATUS_PAGE_MAX = 5000
#: Rule 5: instances counted between two turns of the loop.
SUMMARY_SLICE = 2000
_enc = msgspec.msgpack.Encoder()


class Views:
    def __init__(self, ctx: Context, auctioneer: Auctioneer, promises: Promises) -> None:
        self.ctx = ctx
        self.auctioneer = auctioneer
        self.promises = promises
        self._used: dict[str, tuple[Heartbeat, dict[str, InstanceReport]]] = {}
        #: Rule 3: the ids in order as of one commit (its sha), shared by its pages.
        self._order: tuple[str, list[str]] = ("", [])

    def used(self, node_id: str) -> dict[str, InstanceReport]:
        """Rule 4: what `node_id`'s last heartbeat said of each instance, indexed once a
        heartbeat (a status of every instance looks up each in its node's list)."""
        hb = self.ctx.liveness.heartbeats.get(node_id)
        if hb is None:
            return {}
        cached = self._used.get(node_id)
        if cached is None or cached[0] is not hb:
            cached = self._used[node_id] = (hb, {r.instance_id: r for r in hb.instances})
        return cached[1]

    def state_of(self, rec: InstanceRecord) -> str:
        """The state an operator reads in `gavel status` (and the metrics count): rule 1."""
        iid = rec.instance_id
        node = self.ctx.ledger.state().placement_of(iid) if rec.state in PENDING else None
        if node is None:
            return self.auctioneer.status_of(iid, rec.state)
        if rec.cancelling:
            return "cancelling"
        if self._silent(node):
            return UNKNOWN
        live = self.promises.live.get(iid)
        if live is not None:
            return live
        recalled = self.promises.recalled.get(node, {}).get(iid)
        if recalled is not None and recalled.state == InstanceState.RUNNING:
            return InstanceState.RUNNING
        return InstanceState.PLACED

    def _silent(self, node: str) -> NodeHealth | None:
        """The node's health when it is not heard (unreachable, offline), else None."""
        health = self.ctx.liveness.health(node, self.ctx.now())
        return None if health is NodeHealth.HEALTHY else health

    def _health(self, iid: str, node: str, state: str,
                rec: InstanceRecord) -> tuple[str, str, int]:
        """Rule 2: health, the check that decided, restarts."""
        note = self.promises.health.get(iid)
        if note is not None:
            return note.health, note.check, note.restarts
        recalled = self.promises.recalled.get(node, {}).get(iid)
        if recalled is not None and recalled.health:
            return recalled.health, "", recalled.restarts
        return (InstanceHealth.HEALTHY if state == InstanceState.RUNNING and not rec.spec.checks
                else InstanceHealth.UNKNOWN, "", 0)

    def instance_status(self, rec: InstanceRecord) -> InstanceStatus:
        iid = rec.instance_id
        state = self.ctx.ledger.state()
        pl = state.placement(iid)
        node = state.placement_of(iid)
        st = self.state_of(rec)
        if pl is not None and node is not None and rec.state in PENDING:
            if st == UNKNOWN:
                silent = self._silent(node)
                return InstanceStatus(instance_id=iid, name=rec.spec.name, state=st,
                                      node_id=node, attempt=pl.attempt, ports=dict(pl.ports),
                                      reason=Reason.NODE_NOT_HEARD,
                                      detail=f"node {node} is {silent or 'unreachable'}",
                                      service=rec.service, version=rec.version,
                                      array=rec.array)
            health, check, restarts = self._health(iid, node, st, rec)
            note = self.promises.health.get(iid)
            used = self.used(node).get(iid)
            return InstanceStatus(instance_id=iid, name=rec.spec.name, state=st,
                                  node_id=node, attempt=pl.attempt, ports=dict(pl.ports),
                                  health=health, check=check, restarts=restarts,
                                  reason=rec.reason if rec.cancelling else
                                  note.reason if note else "",
                                  detail="" if rec.cancelling or not note else note.detail,
                                  service=rec.service, version=rec.version,
                                  cpu_used=used.cpu_used if used else 0.0,
                                  memory_used_mb=used.memory_used_mb if used else 0.0,
                                  array=rec.array)
        return InstanceStatus(instance_id=iid, name=rec.spec.name, state=st,
                              node_id=rec.node_id, attempt=rec.attempt, reason=rec.reason,
                              detail=rec.detail, service=rec.service, version=rec.version,
                              array=rec.array)

    async def summary(self, instances: Mapping[str, InstanceRecord], ended: Iterable[str],
                      nc: Any) -> tuple[list[InstanceStatus], dict[str, int], dict[str, int]]:
        """Rule 5: the instances shown, and every one counted by state and by name."""
        states: Counter[str] = Counter()
        names: Counter[str] = Counter()
        live: list[str] = []
        for k, (iid, rec) in enumerate(list(instances.items())):
            if k and not k % SUMMARY_SLICE:
                await asyncio.sleep(0)
            if iid not in instances:  # forgotten meanwhile (retention)
                continue
            state = self.state_of(rec)
            states[state] += 1
            names[rec.spec.name] += 1
            if not rec.state.terminal:
                live.append(iid)
        live.sort()
        chosen = live[:SUMMARY_SHOWN]
        if len(chosen) < SUMMARY_SHOWN:  # the latest ended fill the rest
            chosen += list(itertools.islice((i for i in reversed(list(ended))
                                             if i in instances), SUMMARY_SHOWN - len(chosen)))
        budget = int(getattr(nc, "max_payload", 0) or 1 << 20) // 2
        out: list[InstanceStatus] = []
        size = 0
        for iid in chosen:
            if (kept := instances.get(iid)) is None:
                continue
            st = self.instance_status(kept)
            size += len(_enc.encode(st))
            if out and size > budget:
                break
            out.append(st)
        return out, dict(sorted(states.items())), dict(sorted(names.items()))

    def status_page(self, instances: Mapping[str, InstanceRecord], after: str,
                    nc: Any, head: str = "") -> tuple[list[InstanceStatus], str]:
        """Rule 3: one page, within half of what `nc`'s server takes in one message, and
        the id the next one starts after ("" when none follows). `head`: the commit
        `instances` is of; the pages of one commit sort its ids once."""
        budget = int(getattr(nc, "max_payload", 0) or 1 << 20) // 2
        if head and self._order[0] == head:
            ids = self._order[1]
        else:
            ids = sorted(instances)
            self._order = (head, ids)
        out: list[InstanceStatus] = []
        size = 0
        for iid in ids[bisect.bisect_right(ids, after) if after else 0:]:
            st = self.instance_status(instances[iid])
            size += len(_enc.encode(st))
            if out and (size > budget or len(out) == STATUS_PAGE_MAX):
                return out, out[-1].instance_id
            out.append(st)
        return out, ""
