"""The tree at a commit, read into a `State`: the records under ``instances/``, ``nodes/``,
``services/`` and ``periodic/``.

Rules:
1. A file that does not decode, or names another instance, node or service than its path,
   is not a usable gavel file: it is listed in `State.unreadable`, logged, left as it is in
   git and ignored (a node whose node.json is unusable is `State.unusable_nodes`).
2. Instance records are read flat (put there by hand) first, then from their shards, so the
   broker's own write wins over a stray copy; one read flat or from a wrong shard is noted
   in `State.flat` and moved into its shard at the next write.
3. Only the tree's objects are read; a missing or unreadable object raises libgit2's error
   for the caller to name (`broker.ledger.errors.damaged`).
"""

from __future__ import annotations

import logging

import msgspec
import pygit2

from gavel.broker.ledger.errors import LedgerError
from gavel.broker.ledger.state import State
from gavel.shared.records import (
    InstanceRecord,
    NodeFile,
    PeriodicRecord,
    ServiceRecord,
    instance_path,
)

__all__ = ["read_tree", "service_problem"]

_instance_dec = msgspec.json.Decoder(InstanceRecord)
_node_dec = msgspec.json.Decoder(NodeFile)
_service_dec = msgspec.json.Decoder(ServiceRecord)
_periodic_dec = msgspec.json.Decoder(PeriodicRecord)
log = logging.getLogger("gavel.ledger")


def service_problem(svc: ServiceRecord, name: str) -> str:
    """Why a decoded ``services/<name>.json`` is not a usable service record ("" if it is):
    it names its own file, lists the version it runs, and every version is a service of
    that name (its replicas' ids start with the name)."""
    if svc.name != name:
        return f"it names service {svc.name!r}"
    if svc.spec_of(svc.version) is None:
        return f"it runs version {svc.version}, which it does not list"
    for v in svc.versions:
        if not v.spec.service or v.spec.name != name:
            return f"version {v.version} is not a service named {name!r}"
    return ""


def read_tree(repo: pygit2.Repository, head: str | None) -> State:
    """The `State` the tree of commit `head` holds (an empty one for no commit)."""
    st = State(head=head)
    if head is None:
        return st
    tree = repo[head].peel(pygit2.Tree)
    if "instances" in tree:
        def read(entry: pygit2.Object, path: str) -> None:
            if not (entry.name or "").endswith(".json") or entry.type_str != "blob":
                return
            try:
                rec = _instance_dec.decode(_data(repo, entry.id))
            except msgspec.DecodeError as exc:
                st.unreadable[path] = str(exc)
                return
            iid = rec.instance_id
            if f"{iid}.json" != entry.name:
                st.unreadable[path] = f"it names instance {iid!r}"
                return
            where = instance_path(iid)
            if path != where and iid in st.instances:
                return  # a stray copy: the record read first, or the broker's, wins
            st.put_instance(iid, rec)
            if path != where:  # by hand (flat) or in a wrong shard: moved at the next write
                st.flat[iid] = path

        top = list(_tree(repo, tree["instances"].id))
        for entry in top:  # records put there by hand
            read(entry, f"instances/{entry.name}")
        for shard in top:  # after the flat ones: the broker's own write wins
            if shard.type_str == "tree":
                for entry in _tree(repo, shard.id):
                    read(entry, f"instances/{shard.name}/{entry.name}")
    if "nodes" in tree:
        for entry in _tree(repo, tree["nodes"].id):
            sub = repo[entry.id]
            if isinstance(sub, pygit2.Tree) and "node.json" in sub:
                path = f"nodes/{entry.name}/node.json"
                try:
                    nf = _node_dec.decode(_data(repo, sub["node.json"].id))
                except msgspec.DecodeError as exc:
                    st.unreadable[path] = str(exc)
                    st.unusable_nodes.add(entry.name or "")
                    continue
                if nf.node_id != entry.name:
                    st.unreadable[path] = f"it names node {nf.node_id!r}"
                    st.unusable_nodes.add(entry.name or "")
                    continue
                st.put_node(nf.node_id, nf)
    if "services" in tree:
        for entry in _tree(repo, tree["services"].id):
            name = entry.name or ""
            if not name.endswith(".json") or entry.type_str != "blob":
                continue
            path = f"services/{name}"
            try:
                svc = _service_dec.decode(_data(repo, entry.id))
            except (msgspec.DecodeError, RecursionError) as exc:  # by hand: anything
                st.unreadable[path] = str(exc) or "nested too deeply"
                continue
            problem = service_problem(svc, name.removesuffix(".json"))
            if problem:
                st.unreadable[path] = problem
                continue
            st.put_service(svc.name, svc)
    if "periodic" in tree:
        _read_periodic(repo, tree["periodic"].id, st)
    for path, why in st.unreadable.items():
        log.error("%s is not a usable gavel file (%s): left as it is and ignored; fix or "
                  "remove it in git", path, why)
    st.order_ended()
    return st


def _read_periodic(repo: pygit2.Repository, oid: pygit2.Oid, st: State) -> None:
    """``periodic/<name>.json``: a periodic job's record, usable when it decodes, names its
    own file and holds a job with a schedule (rule 1)."""
    for entry in _tree(repo, oid):
        name = entry.name or ""
        if not name.endswith(".json") or entry.type_str != "blob":
            continue
        path = f"periodic/{name}"
        try:
            job = _periodic_dec.decode(_data(repo, entry.id))
        except (msgspec.DecodeError, RecursionError) as exc:  # by hand: anything
            st.unreadable[path] = str(exc) or "nested too deeply"
            continue
        if job.name != name.removesuffix(".json") or job.spec.schedule is None:
            st.unreadable[path] = f"it names periodic job {job.name!r}" if job.spec.schedule \
                else "its spec has no schedule"
            continue
        st.put_periodic(job.name, job)


def _tree(repo: pygit2.Repository, oid: pygit2.Oid) -> pygit2.Tree:
    obj = repo[oid]
    if not isinstance(obj, pygit2.Tree):
        raise LedgerError(f"{oid} is not a tree")
    return obj


def _data(repo: pygit2.Repository, oid: pygit2.Oid) -> bytes:
    obj = repo[oid]
    if not isinstance(obj, pygit2.Blob):
        raise LedgerError(f"{oid} is not a file")
    return obj.data
