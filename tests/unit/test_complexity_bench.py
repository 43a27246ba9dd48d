"""`python -m gavel.bench.complexity`: each mechanism against its alternative in pairs whose
order alternates, ratios turned so that above 1 the mechanism is better, the lines counted
from the code, and every alternative one the bench's broker takes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gavel.bench import brokerproc
from gavel.bench.complexity import MARGIN, MECHANISMS, Outcome, compare
from gavel.bench.run import Options
from gavel.broker.ledger.committer import AFTER_SLICE_S
from gavel.broker.service import Broker


@dataclasses.dataclass
class Fake:
    figures: dict[str, float]

    def as_dict(self) -> dict[str, Any]:
        return dict(self.figures)


def _figures(opts: Options, simple: bool) -> dict[str, float]:
    keys = {k for m in MECHANISMS for k in (m.key, *m.also)}
    # The alternative is worse on every figure by a factor of 2 (or better by 1.1 below).
    return {k: (2.0 if simple else 1.0) for k in keys}


def test_pairs_alternate_and_ratios_say_how_much_better_the_mechanism_is() -> None:
    seen: list[tuple[str, bool]] = []

    def run(opts: Options) -> Fake:
        simple = _is_simple(opts)
        seen.append((str(opts.broker_flags) + opts.agent_client, simple))
        return Fake(_figures(opts, simple))

    outcomes = compare(Options(progress=False, idle_s=0.0), run, pairs=3)
    assert [o.mechanism.name for o in outcomes] == ["packs", "writer-process", "natslite",
                                                    "slices"]
    # Each mechanism: with, without | without, with | with, without.
    assert [s for _, s in seen] == [False, True, True, False, False, True] * 4
    for o in outcomes:
        m = o.mechanism
        # lower-is-better figures: 2/1; higher-is-better ones: 1/2 (the mechanism is worse).
        assert o.ratios == ([2.0] * 3 if m.lower else [0.5] * 3)
        assert o.earns == m.lower
        assert len(o.pairs) == 3 and o.as_dict()["key"] == m.key
        assert ("does NOT earn" in o.text()) == (not o.earns)


def _is_simple(opts: Options) -> bool:
    return bool(opts.broker_flags) or opts.agent_client == "nats-py"


def test_the_margin_is_on_the_median_of_the_pairs() -> None:
    m = next(m for m in MECHANISMS if m.name == "slices")
    o = Outcome(m, pairs=[({m.key: 10.0}, {m.key: 10.0 * r}) for r in (1.0, 1.2, 5.0)])
    assert o.ratio == 1.2 and o.earns and MARGIN <= 1.2
    o = Outcome(m, pairs=[({m.key: 10.0}, {m.key: 10.0 * r}) for r in (1.0, 1.1, 5.0)])
    assert not o.earns
    # A higher-is-better figure: the mechanism's over the alternative's.
    up = dataclasses.replace(m, key="placements_per_s", lower=False)
    o = Outcome(up, pairs=[({up.key: 10.0 * r}, {up.key: 10.0}) for r in (1.0, 1.3, 2.0)])
    assert o.ratios == [1.0, 1.3, 2.0] and o.earns


def test_every_mechanism_counts_its_lines_and_its_workload_is_an_option() -> None:
    for m in MECHANISMS:
        lines, simple_lines = m.lines()
        assert lines > simple_lines >= 0, m.name
        dataclasses.replace(Options(), **m.workload, **m.simple)  # real fields only


def test_the_bench_broker_takes_each_alternative(tmp_path: Path) -> None:
    base = ["--url", "nats://127.0.0.1:4222", "--state", str(tmp_path)]
    default = brokerproc.config(brokerproc.parser().parse_args(base))
    assert (default.writer, default.objects, default.after_slices) == ("process", "packs",
                                                                       True)
    flags = [f for m in MECHANISMS for f in m.simple.get("broker_flags", ())]
    simple = brokerproc.config(brokerproc.parser().parse_args(base + flags))
    assert (simple.writer, simple.objects, simple.after_slices) == ("thread", "libgit2", False)


def test_the_bench_broker_is_built_with_each_alternative(tmp_path: Path) -> None:
    """The flags reach the parts: the ledger's object writer, the committer's writer and
    its slices."""
    base = ["--url", "nats://127.0.0.1:1", "--state", str(tmp_path)]
    flags = [f for m in MECHANISMS for f in m.simple.get("broker_flags", ())]
    default = dataclasses.replace(brokerproc.config(brokerproc.parser().parse_args(base)),
                                  writer="thread")
    for settings, objects, slices in ((default, "packs", AFTER_SLICE_S), (
            brokerproc.config(brokerproc.parser().parse_args(base + flags)), "libgit2", None)):
        broker = Broker(settings)
        try:
            assert (broker.ledger.objects, broker.committer.lane.slice_s,
                    broker.committer.writer) == (objects, slices, "thread")
        finally:
            broker.committer.close()
