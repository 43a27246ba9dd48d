"""A node reserved for a label key bids on other work only behind every unreserved node."""

from __future__ import annotations

from pathlib import Path

import pytest

from gavel.cli import main as cli
from gavel.cli.config import ConfigError, WorkerConfig, load
from gavel.cli.daemons import worker_strategy
from gavel.cli.options import WORKER_OPTIONS, flags_of
from gavel.shared.auction import Auction, Awarded
from gavel.shared.feasibility import NodeView
from gavel.shared.messages import Bid, BidReply, Capacity, Request
from gavel.shared.strategies import answer, make_strategy
from gavel.shared.strategies.reserve import PREMIUM, Reserved, reserve


def _view(node: str, labels: dict[str, str], used_cpu: float = 0.0) -> NodeView:
    return NodeView(node_id=node, capacity=Capacity(cpu=32.0, memory_mb=65536),
                    committed=Capacity(cpu=used_cpu, memory_mb=0), labels=labels)


def _award(request: Request, views: list[NodeView], strategies: dict[str, object]) -> str:
    auction = Auction("a1", [request], [v.node_id for v in views], 0.0, 1.0)
    for v in views:
        ans = answer(strategies[v.node_id], request, v)  # type: ignore[arg-type]
        auction.receive(BidReply(auction_id="a1", node_id=v.node_id, answers=[ans]), 0.0)
    decision = auction.decide(0.5, {v.node_id: v.capacity.copy() for v in views})[0]
    assert isinstance(decision, Awarded)
    return decision.winner.node_id


def test_plain_work_goes_to_an_unreserved_node_even_a_worse_priced_one() -> None:
    binpack = make_strategy("binpack")
    gpu = _view("gpu-1", {"gpu": "yes"}, used_cpu=30.0)  # nearly full: binpack's favourite
    plain = _view("plain-1", {}, used_cpu=0.0)
    plain_job = Request(instance_id="i1", cpu=1.0, memory_mb=512)
    unreserved = {"gpu-1": binpack, "plain-1": binpack}
    assert _award(plain_job, [gpu, plain], unreserved) == "gpu-1"  # without: it fills the gpu
    reserved = {"gpu-1": reserve(binpack, ["gpu"]), "plain-1": binpack}
    assert _award(plain_job, [gpu, plain], reserved) == "plain-1"


def test_work_that_asks_for_the_key_is_priced_as_the_strategy_prices_it() -> None:
    binpack = make_strategy("binpack")
    wrapped = reserve(binpack, ["gpu"])
    view = _view("gpu-1", {"gpu": "yes"}, used_cpu=8.0)
    gpu_job = Request(instance_id="g", cpu=4.0, memory_mb=1024, labels={"gpu": "yes"})
    plain_job = Request(instance_id="p", cpu=4.0, memory_mb=1024)
    asked, bare = answer(wrapped, gpu_job, view), answer(binpack, gpu_job, view)
    assert isinstance(asked, Bid) and isinstance(bare, Bid)
    assert (asked.load, asked.step, asked.strategy) == (bare.load, bare.step, "binpack")
    other, other_bare = answer(wrapped, plain_job, view), answer(binpack, plain_job, view)
    assert isinstance(other, Bid) and isinstance(other_bare, Bid)
    assert other.load == pytest.approx(other_bare.load + PREMIUM)
    assert other.step == pytest.approx(other_bare.step)  # batch pricing as without it


def test_a_reserved_node_still_takes_plain_work_nobody_else_can() -> None:
    gpu = _view("gpu-1", {"gpu": "yes"})
    full = _view("plain-1", {}, used_cpu=32.0)
    job = Request(instance_id="i1", cpu=2.0, memory_mb=512)
    strategies = {"gpu-1": reserve(make_strategy("least-loaded"), ["gpu"]),
                  "plain-1": make_strategy("least-loaded")}
    assert _award(job, [gpu, full], strategies) == "gpu-1"


def test_no_keys_is_the_strategy_itself() -> None:
    ll = make_strategy("least-loaded")
    assert reserve(ll, []) is ll
    assert isinstance(reserve(ll, ["gpu"]), Reserved)


def _worker(argv: list[str], env: dict[str, str] | None = None) -> WorkerConfig:
    args = cli.build_parser().parse_args(["worker", *argv])
    return load(WorkerConfig, WORKER_OPTIONS, file=None, env=env or {},
                flags=flags_of(args, WORKER_OPTIONS))


def test_the_worker_setting_from_flag_env_and_file(tmp_path: Path) -> None:
    cfg = _worker(["--node-id", "n", "--labels", "gpu=yes,zone=a", "--reserve-for", "gpu"])
    assert cfg.reserve_for == ["gpu"]
    strategy = worker_strategy(cfg)
    assert isinstance(strategy, Reserved) and strategy.keys == {"gpu"}
    cfg = _worker(["--node-id", "n", "--labels", "gpu=yes"], env={"GAVEL_RESERVE_FOR": "gpu"})
    assert cfg.reserve_for == ["gpu"]
    file = tmp_path / "w.toml"
    file.write_text('node_id = "n"\nlabels = { gpu = "yes" }\nreserve_for = ["gpu"]\n')
    assert load(WorkerConfig, WORKER_OPTIONS, file=str(file), env={}).reserve_for == ["gpu"]
    assert not isinstance(worker_strategy(_worker(["--node-id", "n"])), Reserved)


@pytest.mark.parametrize(("argv", "expected"), [
    (["--labels", "zone=a", "--reserve-for", "gpu"],
     "field `reserve_for` names label key 'gpu', which this node does not carry (its labels: "
     "zone)."),
    (["--reserve-for", "gpu"], "which this node does not carry (its labels: none)."),
])
def test_reserving_a_key_the_node_lacks_is_refused(argv: list[str], expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        _worker(["--node-id", "n", *argv])
    assert expected in str(err.value)


def test_a_label_where_a_key_belongs_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(["worker", "--reserve-for", "gpu=yes"])
    assert exit_.value.code == 2
    assert "is a label, not a label key" in capsys.readouterr().err


SIM = """
name = "reserve"
duration_s = 3000.0
sample_s = 30.0
[[nodes]]
count = 12
cpu = 8.0
memory_mb = 16384
[[nodes]]
count = 3
cpu = 16.0
memory_mb = 65536
labels = { gpu = "yes" }
[[gavel]]
name = "plain"
mix = [{ strategy = "binpack", share = 1 }]
[[gavel]]
name = "reserved"
reserve_for = ["gpu"]
mix = [{ strategy = "binpack", share = 1 }]
[baselines]
run = []
[workload]
rate = 0.25
patience_s = 120.0
[[workload.classes]]
name = "service"
weight = 8
cpu = { values = [1.0, 2.0] }
memory_mb = { values = [1024.0] }
duration_s = { dist = "exponential", mean = 200.0 }
[[workload.classes]]
name = "gpu"
weight = 1
cpu = { values = [8.0] }
memory_mb = { values = [16384.0] }
labels = { gpu = "yes" }
duration_s = { dist = "exponential", mean = 200.0 }
"""


def test_in_the_simulator_reserved_gpu_nodes_keep_room_for_gpu_jobs() -> None:
    from gavel.sim.policies import simulate
    from gavel.sim.scenario import parse_scenario

    result = simulate(parse_scenario(SIM.encode()), 1)
    by = {p.policy: p for p in result.policies}
    plain, kept = by["gavel:plain"], by["gavel:reserved"]
    assert "nodes reserved for gpu" in kept.description
    assert kept.unschedulable_by_class.get("gpu", 0) < plain.unschedulable_by_class["gpu"]
