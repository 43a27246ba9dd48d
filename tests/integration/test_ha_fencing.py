"""Fencing on the remote: a real bare repository on local disk, real state repositories.

A leadership's first commit names its epoch; from then on an older leadership's push is
refused (never forced, never merged), and what it committed is never told to anyone. A
standby taking over derives from the remote, whatever its own copy held. Its KV puts are
refused by the key's revision once the next leadership has put the key (a real
nats-server).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import nats
import pygit2
import pytest

from gavel.broker.context import Leadership
from gavel.broker.fencedkv import FencedPuts
from gavel.broker.ledger import takeover
from gavel.broker.ledger.committer import Committer, Item, Planned
from gavel.broker.ledger.plan import View, submit
from gavel.broker.ledger.remote import Fenced, Pusher
from gavel.broker.ledger.repository import Change, Ledger
from gavel.shared import subjects
from gavel.shared.messages import Spec
from gavel.shared.records import InstanceRecord
from tests.integration.harness import wait_for
from tests.unit.commitkit import Then, heard

pytestmark = pytest.mark.integration
REF = "refs/heads/main"
SIG = pygit2.Signature("an operator", "op@example.com")


def record(iid: str) -> InstanceRecord:
    return InstanceRecord(instance_id=iid, spec=Spec(name=iid, command=["true"]))


def commit(ledger: Ledger, iid: str) -> str:
    return ledger.apply(Change(instances={iid: record(iid)}), f"submit {iid}\n",
                        ledger.state().head)


@pytest.fixture
def remote(tmp_path: Path) -> tuple[pygit2.Repository, str]:
    repo = pygit2.init_repository(str(tmp_path / "remote.git"), bare=True, initial_head="main")
    return repo, str(tmp_path / "remote.git")


def head(repo: pygit2.Repository) -> str:
    return str(repo.references[REF].target)


def history(repo: pygit2.Repository) -> list[str]:
    return [str(c.id) for c in repo.walk(repo.references[REF].target)]


def test_an_older_leaderships_push_is_refused_and_nothing_of_it_lands(
        tmp_path: Path, remote: tuple[pygit2.Repository, str]) -> None:
    repo, url = remote
    a, b = Ledger(tmp_path / "a" / "state.git"), Ledger(tmp_path / "b" / "state.git")
    pa, pb = Pusher(a.path, REF, url), Pusher(b.path, REF, url)
    took_a = pa.take_over("a", 3, "t0")
    assert (took_a.epoch, takeover.epoch_of(repo, head(repo))) == (3, 3)
    landed = commit(Ledger(a.path), "i1")
    assert pa.sync() == landed and head(repo) == landed
    took_b = pb.take_over("b", 2, "t1")  # a lease bucket made anew: revision 2 < 3
    assert took_b.epoch == 4 and took_b.previous == 3  # raised past the branch's epoch
    assert landed in history(repo)  # b derives from everything a pushed
    assert sorted(Ledger(b.path).state().instances) == ["i1"]
    late = commit(Ledger(a.path), "i2")  # a, deposed, still commits locally...
    with pytest.raises(Fenced, match="epoch 4"):
        pa.sync()  # ...and its push is refused: it never forces, never merges
    assert head(repo) == took_b.head and late not in history(repo)
    assert all(len(repo[c].parent_ids) <= 1 for c in history(repo))  # no merge was made


def test_a_hand_commit_in_the_leaders_epoch_is_merged_not_fenced(
        tmp_path: Path, remote: tuple[pygit2.Repository, str]) -> None:
    repo, url = remote
    a = Ledger(tmp_path / "a" / "state.git")
    pa = Pusher(a.path, REF, url)
    pa.take_over("a", 1, "t0")
    tree = repo[head(repo)].peel(pygit2.Tree)
    tb = repo.TreeBuilder(tree)
    tb.insert("NOTES", repo.create_blob(b"by hand\n"), pygit2.enums.FileMode.BLOB)
    by_hand = str(repo.create_commit(REF, SIG, SIG, "notes by hand", tb.write(),
                                     [pygit2.Oid(hex=head(repo))]))
    ours = commit(Ledger(a.path), "i1")
    pushed = pa.sync()  # refused, fetched: the same epoch, so a hand commit - merged
    assert pushed is not None and head(repo) == pushed
    merged = repo[pushed].peel(pygit2.Commit)
    assert [str(p) for p in merged.parent_ids] == [ours, by_hand]


def test_a_standby_takes_over_from_the_remote_not_from_its_own_stale_copy(
        tmp_path: Path, remote: tuple[pygit2.Repository, str]) -> None:
    repo, url = remote
    a, b = Ledger(tmp_path / "a" / "state.git"), Ledger(tmp_path / "b" / "state.git")
    Pusher(a.path, REF, url).take_over("a", 1, "t0")
    pa = Pusher(a.path, REF, url, epoch=1)
    commit(Ledger(a.path), "on-remote")
    pa.sync()
    commit(b, "stale-local")  # b's own copy: a commit the remote never had
    took = Pusher(b.path, REF, url).take_over("b", 5, "t1")
    fresh = Ledger(b.path).state()
    assert sorted(fresh.instances) == ["on-remote"] and fresh.head == took.head
    leader = msgspec.json.decode(
        repo[took.head].peel(pygit2.Tree)[takeover.LEADER_FILE].data, type=takeover.LeaderFile)
    assert (leader.epoch, leader.broker_id, leader.since) == (5, "b", "t1")


async def test_a_fenced_leader_tells_nobody_what_it_committed(
        tmp_path: Path, remote: tuple[pygit2.Repository, str]) -> None:
    repo, url = remote
    a = Ledger(tmp_path / "a" / "state.git")
    fenced: list[str] = []
    pa = Pusher(a.path, REF, url, on_fenced=fenced.append)
    await pa.lead("a", 1, "t0")
    b = Ledger(tmp_path / "b" / "state.git")
    Pusher(b.path, REF, url).take_over("b", 2, "t1")  # while a still believes it leads
    committer = heard(Committer(Ledger(a.path), writer="thread"))
    committer.on_commit = lambda change, sha: pa.notify()
    committer.durable = pa
    told: list[str] = []
    mirrored: list[str] = []
    committer.on_durable = lambda change, sha: mirrored.append(sha)

    def plan(view: View) -> Planned:
        submit(view, record("deposed"))
        return Planned(lines=["submit deposed"], effects=[Then(told.append)])

    tasks = [asyncio.create_task(committer.run()), asyncio.create_task(pa.run())]
    committer.submit(Item(plan=plan))
    try:
        await wait_for(lambda: bool(fenced), 20, what="the pusher to be fenced")
        await asyncio.sleep(0.2)
        assert "another broker leads" in fenced[0]
        assert told == [] and mirrored == []  # landed locally, never durable: never told
        assert "deposed" in Ledger(a.path).state().instances  # it did commit, locally
        assert "deposed" not in Ledger(Path(url)).state().instances
        assert takeover.epoch_of(repo, head(repo)) == 2
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        committer.close()


async def test_a_deposed_leaders_kv_put_is_refused_by_the_keys_revision(nats_url: str) -> None:
    """The mirror's puts of a leadership expect the revision its own last put made: once the
    next leadership has put a key, the deposed one's late put of it is refused by the server
    (and, were it not, carries the older epoch workers ignore)."""
    nc = await nats.connect(nats_url)
    try:
        kv = await nc.jetstream().create_key_value(bucket=subjects.NODES_BUCKET, history=1)
        still = [True]  # what the old leadership's lease says when asked

        async def confirm() -> bool:
            return still[0]

        old = FencedPuts(Leadership(broker_id="a", epoch=1, confirm=confirm, ha=True))
        new = FencedPuts(Leadership(broker_id="b", epoch=2, ha=True))
        old.nc = new.nc = nc
        key = subjects.NODE_KEY.format(node="n1")

        async def value() -> dict[str, object]:
            entry = await kv.get("n1")
            return dict(json.loads(entry.value or b"{}"))

        old.put(key, b'{"node_id":"n1","instances":{}}')
        await wait_for(lambda: "n1" in old.revision, 10, what="the old leadership's put")
        new.put(key, b'{"node_id":"n1","draining":true}')  # the takeover rebuilds the mirror
        await wait_for(lambda: "n1" in new.revision, 10, what="the new leadership's put")
        still[0] = False  # deposed, though its own clock has not said so yet: a put
        old.put(key, b'{"node_id":"n1","instances":{"x":{}}}')  # made before it knew
        await wait_for(lambda: old.refused == 1 and "n1" not in old._busy, 10,
                       what="the late put refused, and dropped")
        assert await value() == {"epoch": 2, "node_id": "n1", "draining": True}
        await kv.put("n1", b'{"node_id":"n1","epoch":1}')  # written behind its back
        new.put(key, b'{"node_id":"n1"}')  # refused; the lease holds: put again, and heal
        await wait_for(lambda: new.refused == 1 and "n1" not in new._busy, 10, what="healed")
        assert await value() == {"epoch": 2, "node_id": "n1"}
    finally:
        await nc.close()
