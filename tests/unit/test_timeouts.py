"""No module of the broker, the worker or the transport sets its own clock (`shared.timing`
rule 1): every timeout, retry pause and shutdown bound is a field of `Timing`, so one config
table sets them and ``GAVEL_FAST_TIMERS`` shrinks the protocol's.

What the scan finds: a number of seconds written in the code where a wait is bounded or
paced - `asyncio.wait_for(x, 5)`, `asyncio.timeout(5)`, `asyncio.sleep(0.5)`,
`anything(timeout=5)` or `(..._s=5)`, a parameter `timeout=5` / `..._s=5`, a module
constant `..._S = 5`. `ALLOWED` names each that stays, with the reason it is not a clock of
gavel's `Timing`; an entry that no longer matches anything fails too, so the list stays true.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROOMS = ["broker", "worker", "transport"]

_CLIENT = "the operator's client, not a daemon: its waits are the command's"
ALLOWED = {
    # The operator's client.
    "transport/execclient.py::run::wait_for(1.0)": _CLIENT,
    # Pacing of another program's I/O, not a wait of the protocol.
    "worker/execsession.py::ProcessSession.write::sleep(0.01)":
        "a full terminal is written again at the kernel's pace",
    "worker/execsession.py::ContainerSession.wait::sleep(0.05)":
        "the Docker Engine API has no wait for an exec: its inspect is polled",
    # Settings of their own table, not timeouts written in code.
    "broker/config.py::Config::field connect_wait_s=30.0":
        "a setting of the broker's Config (the daemon passes None: for ever)",
    "broker/ha.py::HaSettings::field ttl_s=10.0": "the lease's clocks are the [ha] table's",
    "broker/ha.py::HaSettings::field renew_s=2.0": "the lease's clocks are the [ha] table's",
    "broker/lease.py::<module>::_CLOSE_S=2.0":
        "how long past a lease's expected lapse a standby keeps trying: of the lease's TTL",
    "worker/logfiles.py::LogLimits::field keep_s=86400.0":
        "how long an instance's logs are kept: the [logs] limits, not a timeout",
    # Not clocks: costs, freshness and pacing of the machine's own work.
    "broker/ledger/committer.py::<module>::AFTER_SLICE_S=0.0005":
        "a CPU slice of a commit's effects between bid replies, not a wait",
    "broker/ledger/repository.py::<module>::_HEAD_FRESH_S=0.005":
        "how long a read of the ref is reused: a cache, not a wait",
    "broker/mirror.py::<module>::_SLACK_S=0.001": "rounding slack of the mirror's window",
    "broker/ledger/gitwriter.py::<module>::ORPHAN_CHECK_S=1.0":
        "the writer process (no Timing of its own) looks for its broker this often",
    "broker/ledger/stalelock.py::<module>::LOCK_WAIT_S=1.0":
        "a lock must stay unchanged this long at start to be a dead writer's: git's pace",
    "broker/ledger/remote.py::Pusher.__init__::param max_backoff_s=60.0":
        "the cap of the push back-off, whose first step is Timing.retry_s",
    "worker/cgroups.py::release::param every_s=0.02": "the kernel's pace emptying a cgroup",
    "worker/usage.py::<module>::MIN_INTERVAL_S=1.0":
        "the shortest window a CPU share is measured over, not a wait",
    # The machine's other programs, behind their own clients.
    "worker/engine.py::Engine.client::DockerClient(timeout=60)": "the Docker Engine API's client",
    "worker/engine.py::get::param timeout=10.0": "the Docker Engine API's client",
    "worker/isolation.py::_works::run(timeout=30)":
        "a one-off probe at start whether isolation works here",
    "worker/metrics.py::_AgentCollector._snapshot::result(timeout=10)":
        "a scrape thread waiting for the event loop: the scraper's own timeout governs",
    "worker/probes.py::_http::timeout(0.5)":
        "reading the body that explains a failed check, after the check's own timeout",
    "transport/rejects.py::<module>::INTERVAL_S=60.0":
        "a refusal is logged once per kind and peer this often: a log window",
    # The operator's side.
    "transport/eventstream.py::<module>::MAX_AGE_S=expr":
        "how long the event history keeps an event: a stream setting",
    "transport/eventstream.py::<module>::POLL_S=1.0": _CLIENT,
}

_PACED = {"wait_for": slice(1, None), "timeout": slice(0, None), "sleep": slice(0, None)}


def _seconds(name: str) -> bool:
    return name == "timeout" or name.endswith(("_s", "_S", "timeout"))


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
'''
    assert scan(code, "m.py") == [
        "m.py::<module>::WAIT_S=5.0", "m.py::A::field grace_s=3.0",
        "m.py::A.f::param timeout=2.0", "m.py::A.f::param pause_s=0.5",
        "m.py::A.f::wait_for(4)", "m.py::A.f::timeout(1.5)", "m.py::A.f::sleep(0.25)",
        "m.py::A.f::request(retry_s=7)"]
