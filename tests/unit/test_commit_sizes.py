"""Every commit item says how many records it writes (committer rule 6 caps a commit by
that sum): a submission of N instances is N, an auction's item one per request."""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker.api import Api
from broker.committer import Item
from broker.service import Broker
from shared.api import SubmitRequest
from shared.messages import Request, Spec
from shared.timing import Timing

SPEC = Spec(name="web", command=["true"], cpu=0.1, memory_mb=16)


def _broker(root: Path) -> tuple[Broker, list[Item]]:
    b = Broker(nats_url="nats://127.0.0.1:1", state_dir=root, timing=Timing())
    items: list[Item] = []
    b.committer.submit = items.append  # type: ignore[method-assign]
    return b, items


async def test_a_submission_of_n_instances_is_an_item_of_size_n(tmp_path: Path) -> None:
    b, items = _broker(tmp_path)
    task = asyncio.ensure_future(Api(b).submit(SubmitRequest(spec=SPEC, count=7)))
    await asyncio.sleep(0)
    task.cancel()
    assert [i.size for i in items] == [7]


async def test_an_auction_is_an_item_of_one_per_request(tmp_path: Path) -> None:
    b, items = _broker(tmp_path)
    requests = [Request.of(f"web-{k}", SPEC) for k in range(5)]
    b.auctioneer.open(requests, [], now=0.0)  # no candidates: it closes at once
    assert [i.size for i in items] == [5]
