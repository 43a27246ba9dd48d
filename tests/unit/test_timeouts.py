"""No module of the broker, the worker, the transport, the gateway, the client or the command
sets its own clock (`shared.timing` rule 1): every timeout, retry pause and shutdown bound is
a field of `Timing`, so one config table sets them and ``GAVEL_FAST_TIMERS`` shrinks the
protocol's (the machine's waits, rule 3 there, stay).

What the scan finds: a number of seconds written in the code where a wait is bounded or
paced - `asyncio.wait_for(x, 5)`, `asyncio.timeout(5)`, `asyncio.sleep(0.5)`,
`anything(timeout=5)` or `(..._s=5)`, a parameter `timeout=5` / `..._s=5`, a module
constant `..._S = 5`, and a floor or cap written around a clock - `max(1.0, renew_s)`,
`min(0.25, timing.tick_s)` (a `max`/`min` with a number beside a name of seconds, a tick, a
deadline or a `timing`): the clock may be the config's, but the number is a timeout of its
own that neither `[timing]` nor fast timers reach (`Timing.answer_within` and its fields are
how such a bound is written). `ALLOWED` names each that stays, with the reason it is not a clock of
gavel's `Timing`; an entry that no longer matches anything fails too, so the list stays true.

Not scanned: `shared/` (the core: `Timing` itself, and the defaults of a spec's own settings,
an operator's restart policy or check interval), `sim/` (virtual time), and `bench/`: the
harness drives a cluster from outside, and its waits bound the experiment (how long a
measurement waits for the cluster it measures, the sizes it is run at), not the system; a
harness wait shrunk by fast timers would change what is measured, not how gavel runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROOMS = ["broker", "worker", "transport", "gateway", "client", "cli"]

ALLOWED = {
    # Pacing of another program's I/O, not a wait of the protocol.
    "transport/tasks.py::<module>::CANCEL_AGAIN_S=0.05":
        "nats-py's pace taking a cancel: repeated until one takes, nobody waits it out",
    "worker/execsession.py::ProcessSession.write::sleep(0.01)":
        "a full terminal is written again at the kernel's pace",
    "worker/cgroups.py::release::param every_s=0.02": "the kernel's pace emptying a cgroup",
    # Settings of their own table (a flag, a variable, a config key), not clocks in code.
    "worker/logfiles.py::LogLimits::field keep_s=86400.0":
        "how long an instance's logs are kept: the [logs] limits, not a timeout",
    "cli/config.py::WorkerConfig::field ended_logs_s=86400.0":
        "the same [logs] limit, as the worker's config file sets it",
    "broker/ha.py::HaSettings::field ttl_s=10.0": "the [ha] table's default, for a broker "
        "built without the config (bench's)",
    "broker/ha.py::HaSettings::field renew_s=2.0": "the [ha] table's default, as ttl_s",
    "cli/config.py::HaConfig::field lease_ttl_s=10.0":
        "the lease's TTL: the [ha] table's setting (--lease-ttl-s), checked with renew_s",
    "cli/config.py::HaConfig::field renew_s=2.0":
        "the lease's renewal: the [ha] table's setting (--lease-renew-s)",
    # Not clocks: costs, freshness and windows of the machine's own work.
    "broker/ledger/afterlane.py::<module>::AFTER_SLICE_S=0.0005":
        "a CPU slice of a commit's effects between bid replies, not a wait",
    "broker/steps.py::<module>::SLICE_S=0.02":
        "a CPU slice of a long read over every replica between the loop's other work",
    "broker/ledger/repository.py::<module>::_HEAD_FRESH_S=0.005":
        "how long a read of the ref is reused: a cache, not a wait",
    "broker/mirror.py::<module>::_SLACK_S=0.001": "rounding slack of the mirror's window",
    "worker/usage.py::<module>::MIN_INTERVAL_S=1.0":
        "the shortest window a CPU share is measured over, not a wait",
    "transport/rejects.py::<module>::INTERVAL_S=60.0":
        "a refusal is logged once per kind and peer this often: a log window",
    "transport/eventstream.py::<module>::MAX_AGE_S=expr":
        "how long the event history keeps an event: a stream setting",
    "cli/ui/usage.py::<module>::EVERY_S=2.0":
        "the resolution of the dashboard's usage history (a point per window), not a wait",
    "cli/ui/feed.py::<module>::CLOSE_RETRY_S=0.1":
        "the pace a cancel is repeated at (the NATS client swallows one on 3.11), not a bound",
    # Floors that keep a wait above zero once its own clock ran out, not clocks.
    "transport/client.py::_answer::max(0.001, clock)":
        "the last try of a request whose timeout ran out: nats-py refuses a timeout of 0",
    "cli/supervise.py::_stop_all::max(0.1, clock)":
        "a child left once the shared grace ran out is looked at once more before its kill",
    # A measurement, not the system: the harness's own bound, as bench/'s (not scanned).
    "cli/api/hop.py::measure::wait_for(60)":
        "the HTTP hop's measurement (docs/performance.md): how long it waits for an event it times",
}

_PACED = {"wait_for": slice(1, None), "timeout": slice(0, None), "sleep": slice(0, None)}
#: Names that hold a clock besides those `_seconds` knows by their ending.
_CLOCKS = {"tick", "deadline", "interval", "left", "timing"}


def _seconds(name: str) -> bool:
    return name == "timeout" or name.endswith(("_s", "_S", "timeout"))


def _clock(node: ast.AST) -> bool:
    """Whether the expression at `node` reads a clock: a name (or attribute) of seconds."""
    names = [n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
             if isinstance(n, ast.Name | ast.Attribute)]
    return any(_seconds(name) or name in _CLOCKS for name in names)


def _literal(node: ast.AST | None) -> object:
    """The number written at `node` ("expr" for arithmetic on numbers), or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) \
            and not isinstance(node.value, bool):
        return node.value or None  # 0: "at once", no clock
    if isinstance(node, ast.BinOp) and _literal(node.left) and _literal(node.right):
        return "expr"
    return None


class _Scan(ast.NodeVisitor):
    def __init__(self, where: str) -> None:
        self.where = where
        self.scope: list[str] = []
        self.found: list[str] = []

    def _note(self, what: str) -> None:
        self.found.append(f"{self.where}::{'.'.join(self.scope) or '<module>'}::{what}")

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        a = node.args
        positional = a.posonlyargs + a.args
        pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults,
                         strict=True))
        pairs += [(k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
        for arg, default in pairs:
            if _seconds(arg.arg) and (value := _literal(default)):
                self._note(f"param {arg.arg}={value}")
        self.generic_visit(node)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if isinstance(target, ast.Name) and target.id.endswith("_S") \
                    and (value := _literal(node.value)):
                self._note(f"{target.id}={value}")
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if self.scope and isinstance(node.target, ast.Name) and _seconds(node.target.id) \
                and (value := _literal(node.value)):
            self._note(f"field {node.target.id}={value}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) \
            else ""
        for arg in node.args[_PACED[name]] if name in _PACED else []:
            if value := _literal(arg):
                self._note(f"{name}({value})")
        if name in ("max", "min") and any(_clock(a) for a in node.args):
            # a floor or cap written around a clock: a timeout fast timers cannot shrink
            for arg in node.args:
                if value := _literal(arg):
                    self._note(f"{name}({value}, clock)")
        for kw in node.keywords:
            if kw.arg and _seconds(kw.arg) and (value := _literal(kw.value)):
                self._note(f"{name}({kw.arg}={value})")
        self.generic_visit(node)


def scan(source: str, where: str) -> list[str]:
    s = _Scan(where)
    s.visit(ast.parse(source))
    return s.found


def _house() -> list[str]:
    return [hit for room in ROOMS for p in sorted((ROOT / room).rglob("*.py"))
            for hit in scan(p.read_text(), str(p.relative_to(ROOT)))]


def test_no_module_sets_its_own_clock() -> None:
    own = [hit for hit in _house() if hit not in ALLOWED]
    assert own == [], ("a clock written in the code: make it a field of shared.timing.Timing "
                       f"(or name it in ALLOWED with the reason it is none): {own}")


def test_a_floor_or_cap_written_around_a_clock_is_found() -> None:
    """`max(1.0, renew_s)` hides a timeout as surely as `sleep(1.0)`: the lease's watch, as
    it was, is caught; its clocks as `Timing` fields and methods are not."""
    before = """
async def _watch(self):
    msg = await self.nc.request(subject, request, timeout=max(1.0, self.renew_s))
    await asyncio.sleep(min(1.0, self.renew_s))
"""
    after = """
async def _watch(self):
    msg = await self.nc.request(subject, request,
                                timeout=self.timing.answer_within(self.renew_s))
    await asyncio.sleep(min(self.timing.rewatch_s, self.renew_s))
"""
    assert scan(before, "broker/lease.py") == ["broker/lease.py::_watch::max(1.0, clock)",
                                               "broker/lease.py::_watch::min(1.0, clock)"]
    assert scan(after, "broker/lease.py") == []


def test_every_allowed_clock_is_still_there() -> None:
    assert sorted(set(ALLOWED) - set(_house())) == []


def test_the_scan_finds_each_shape() -> None:
    code = '''
import asyncio
WAIT_S = 5.0
class A:
    grace_s: float = 3.0
    async def f(self, timeout=2.0, *, pause_s=0.5, now_s=0):
        await asyncio.wait_for(x, 4)
        async with asyncio.timeout(1.5):
            await asyncio.sleep(0.25)
        await asyncio.sleep(0)
        nc.request(b"", timeout=self.t, retry_s=7)
        await asyncio.sleep(max(1.0, self.settings.renew_s))
        poll = min(0.25, timing.tick_s)
        put(timeout=max(0.1, min(self.renew_s, self.deadline - first)))
        await asyncio.sleep(max(0.0, self.deadline - self.clock()))
        keep = max(0, len(old) - n) + min(1.0, memory.percent / 100)
        bound = max(self.timing.answer_least_s, self.renew_s)
'''
    assert scan(code, "m.py") == [
        "m.py::<module>::WAIT_S=5.0", "m.py::A::field grace_s=3.0",
        "m.py::A.f::param timeout=2.0", "m.py::A.f::param pause_s=0.5",
        "m.py::A.f::wait_for(4)", "m.py::A.f::timeout(1.5)", "m.py::A.f::sleep(0.25)",
        "m.py::A.f::request(retry_s=7)", "m.py::A.f::max(1.0, clock)",
        "m.py::A.f::min(0.25, clock)", "m.py::A.f::max(0.1, clock)"]
