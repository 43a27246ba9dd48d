"""Plans take what they read: what a broker part hands the committer is a plan function and
the data it reads (the epoch, the winners' port ranges, the clock, the wall clock, the
nodes as heard, the health they said, a seed for new ids), gathered as the part submits
it. Planning reads nothing of the broker, so a plan planned again after the broker moved
on plans the same, and a plan is called in a test with chosen inputs and no broker.

Checked twice: statically (`broker/` hands the committer no lambda, nested function or
bound method, and no plan function reads a clock, a random source or a part), and on a
live broker whose clock, wall clock, epoch, heartbeats, health notes and random sources
change between the submit and the planning."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Callable, Generator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from gavel.broker.effects import Publish
from gavel.broker.ledger.committer import Item, Planned
from gavel.broker.ledger.plan import View, submit
from gavel.broker.steps import at_once
from gavel.shared.auction import Auction, Awarded, Decision
from gavel.shared.award import NodeBid
from gavel.shared.messages import Request, Spec
from gavel.shared.records import InstanceRecord
from tests.unit.test_fuzz_broker import NODES, SPEC, Rig, heartbeat
from tests.unit.test_services import UPDATE, deployed, place_waiting, sweep, web

ROOT = Path(__file__).resolve().parents[2]
#: The committer and the one-pass wrapper are the machinery plans go through, not parts.
MACHINERY = {"broker/ledger/committer.py", "broker/onepass.py"}
#: Modules of pure plans and their helpers: every function in them is checked.
PURE = {"broker/awardplan.py", "broker/promiseplans.py", "broker/serviceplans.py",
        "broker/preemptions.py", "broker/keeper.py", "broker/ledger/plan.py"}
#: What a plan must not read: the parts of the broker, its clocks and its random sources.
SHELL_ATTRS = {"ctx", "leader", "liveness", "heartbeats", "promises", "timers", "outbox",
               "committer", "ledger", "rng", "wall", "clock"}
CLOCK_CALLS = {"now", "time", "monotonic", "perf_counter", "utcnow", "today"}
#: Calls whose `plan=` is a plan on its way to the committer (as is `plan=` of a partial, the
#: second argument of a part's `passes.submit` and a method's parameter named `plan`).
PLAN_KEYWORDS = {"Item", "and_then", "or_only", "plan_verb", "plan_pass"}


# -- statically ----------------------------------------------------------------------------
def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted((ROOT / "broker").rglob("*.py")):
        name = str(path.relative_to(ROOT))
        if name not in MACHINERY:
            yield name, ast.parse(path.read_text())


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _is_partial(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and _callee(node) == "partial"


class _Plans(ast.NodeVisitor):
    """Every plan a module hands on: each is checked to be a partial of a module-level
    function over data, or a name bound to one, or a parameter passed through."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.found: list[str] = []
        self.scopes: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
        self.methods: dict[str, list[str]] = {}  # method -> its parameters, per class seen

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.methods = {f.name: [a.arg for a in f.args.args][1:] for f in node.body
                        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
        self.generic_visit(node)

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scopes.append(node)
        self.generic_visit(node)
        self.scopes.pop()

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function

    def visit_Call(self, node: ast.Call) -> None:
        name = _callee(node)
        for kw in node.keywords:
            if kw.arg == "plan" and (name in PLAN_KEYWORDS or _is_partial(node)):
                self._check(kw.value, node)
        if isinstance(node.func, ast.Attribute):
            f = node.func
            if f.attr == "submit" and isinstance(f.value, ast.Attribute) and \
                    f.value.attr == "passes" and len(node.args) > 1:
                self._check(node.args[1], node)
            elif isinstance(f.value, ast.Name) and f.value.id == "self" and \
                    "plan" in self.methods.get(f.attr, []):
                at = self.methods[f.attr].index("plan")
                if at < len(node.args):
                    self._check(node.args[at], node)
        self.generic_visit(node)

    def _check(self, plan: ast.expr, call: ast.Call) -> None:
        scope = self.scopes[-1] if self.scopes else None
        why = self._wrong(plan, scope)
        if why:
            self.found.append(f"{self.where}:{call.lineno} {why}")

    def _wrong(self, plan: ast.expr, scope: ast.FunctionDef | ast.AsyncFunctionDef | None
               ) -> str:
        if _is_partial(plan):
            assert isinstance(plan, ast.Call)
            fn = plan.args[0] if plan.args else None
            if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) and \
                    fn.value.id == "self":
                return f"a bound method as a plan: self.{fn.attr}"
            if isinstance(fn, ast.Name) and scope is not None and any(
                    isinstance(n, ast.FunctionDef) and n.name == fn.id
                    for n in ast.walk(scope)):
                return f"a nested function as a plan: {fn.id}"
            inner = [kw.value for kw in plan.keywords if kw.arg == "plan"]
            return next((w for w in (self._wrong(p, scope) for p in inner) if w), "")
        if isinstance(plan, ast.Name) and scope is not None:
            if plan.id in [a.arg for a in scope.args.args + scope.args.kwonlyargs]:
                return ""  # passed through: checked where its caller builds it
            for node in ast.walk(scope):
                if isinstance(node, ast.FunctionDef) and node.name == plan.id:
                    return f"a nested function as a plan: {plan.id}"
                if isinstance(node, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == plan.id for t in node.targets):
                    return self._wrong(node.value, scope)
        if isinstance(plan, ast.Lambda):
            return "a lambda as a plan"
        return f"not a partial of a plan function: {ast.unparse(plan)}"


def _misplanned(where: str, tree: ast.Module) -> list[str]:
    plans = _Plans(where)
    plans.visit(tree)
    return plans.found


def _reads_the_shell(where: str, tree: ast.Module, every: bool) -> list[str]:
    """What a plan function (`plan_*`; with `every`, any function) reads that is no input:
    a part, a clock, an unseeded random source."""
    found = []
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef) or not (every or fn.name.startswith("plan_")):
            continue
        for node in ast.walk(fn):
            bad = ""
            if isinstance(node, ast.Name) and node.id in {"self", "ctx", "time"}:
                bad = node.id
            elif isinstance(node, ast.Attribute) and node.attr in SHELL_ATTRS:
                bad = f".{node.attr}"
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                f = node.func
                if f.attr in CLOCK_CALLS:
                    bad = f".{f.attr}()"
                elif isinstance(f.value, ast.Name) and f.value.id == "random" and \
                        (f.attr != "Random" or not node.args):
                    bad = f"random.{f.attr}({'' if f.attr != 'Random' else 'no seed'})"
            if bad:
                found.append(f"{where}:{node.lineno} {fn.name} reads {bad}")
    return found


def test_every_plan_handed_to_the_committer_is_a_partial_of_a_plan_function() -> None:
    wrong = [w for where, tree in _modules() for w in _misplanned(where, tree)]
    assert wrong == []


def test_no_plan_function_reads_a_clock_a_random_source_or_a_part() -> None:
    wrong = [w for where, tree in _modules()
             for w in _reads_the_shell(where, tree, every=where in PURE)]
    assert wrong == []


def test_the_static_checks_find_a_plan_that_reads_the_shell() -> None:
    source = '''
class Part:
    def keep(self, view, name): ...
    def _submit(self, plan): ...
    def watch(self, now):
        def plan(v):
            return None
        self.ctx.committer.submit(Item(plan=lambda v: plan_x(v, self.ctx.leader.epoch)))
        self.passes.submit("n", functools.partial(self.keep, name="n"))
        self._submit(plan)
        self._submit(functools.partial(and_then, plan=functools.partial(plan_y, a=1)))
        self._submit(functools.partial(plan_y, a=self.now()))

def plan_x(view, epoch):
    return view.at(time.monotonic(), random.random(), random.Random())

def plan_y(view, a, ctx):
    return random.Random(a), ctx.leader.epoch, view.wall()
'''
    tree = ast.parse(source)
    assert sorted(w.split(" ", 1)[1] for w in _misplanned("m", tree)) == [
        "a bound method as a plan: self.keep", "a lambda as a plan",
        "a nested function as a plan: plan"]
    assert sorted(w.split(" ", 1)[1] for w in _reads_the_shell("m", tree, every=False)) == [
        "plan_x reads .monotonic()", "plan_x reads random.Random(no seed)",
        "plan_x reads random.random()", "plan_x reads time", "plan_y reads .leader",
        "plan_y reads .wall", "plan_y reads ctx"]


# -- on a live broker ----------------------------------------------------------------------
def _captured(rig: Rig) -> list[Item]:
    """What the broker's parts submit from now on, held here: the committer never sees it."""
    items: list[Item] = []
    rig.b.committer.submit = items.append  # type: ignore[method-assign]
    return items


def _meanwhile(rig: Rig) -> None:
    """The broker moves on between a submit and its planning: its clock and wall clock, the
    epoch, n1's port range, every node but n1 unheard long enough to be offline, no health
    said, its random sources drawn from."""
    rig.now += 1000.0
    rig.b.leader.epoch += 7
    rig.b.liveness.record(heartbeat("n1", port_range=[30000, 30999]), rig.now)
    later = datetime(2031, 1, 1, tzinfo=UTC)
    for part in (rig.b.services, rig.b.systems):
        part.wall = lambda: later
        part.rng.seed(99)
    rig.b.promises.health.clear()
    rig.b.services._first_seen.clear()  # what the part remembers of its replicas' clocks
    rig.b.services._healthy_since.clear()


def _plan(item: Item, view: View) -> Planned | None:
    """`item`'s plan on `view`, its steps run at once if it reads in steps."""
    got = item.plan(view)
    return at_once(got) if isinstance(got, Generator) else got


def _planned_alike(rig: Rig, item: Item) -> Planned:
    """`item` planned on the broker's state, then again after the broker moved on: the same
    lines and effects."""
    first = _plan(item, View(rig.b.ledger.state()))
    _meanwhile(rig)
    again = _plan(item, View(rig.b.ledger.state()))
    assert first is not None and again is not None
    assert (again.lines, again.effects) == (first.lines, first.effects)
    return first


def _state_with(rig: Rig, *records: InstanceRecord) -> None:
    state = rig.b.ledger.state()
    view = View(state)
    for rec in records:
        submit(view, rec)
    rig.b.ledger.apply(view.change, "submit", state.head)


def test_an_award_plans_with_the_port_range_and_epoch_of_its_close(rig: Rig) -> None:
    _state_with(rig, InstanceRecord(instance_id="web-2", spec=SPEC))
    items = _captured(rig)
    won = Awarded(request=Request.of("web-2", SPEC), winner=NodeBid(node_id="n1", load=0.1),
                  tie_broken=False, bids=[], declines=[], silent=[])
    decisions: list[Decision] = [won]
    rig.b.auctioneer._decided(Auction("a-2", [won.request], NODES, rig.now, 1.0), decisions,
                              0.01)
    [item] = items
    _planned_alike(rig, item)
    view = View(rig.b.ledger.state())
    assert item.plan(view) is not None
    nf = view.change.nodes["n1"]
    assert nf is not None and 20000 <= nf.instances["web-2"].ports["http"] < 30000


def test_a_migration_tells_the_node_to_stop_in_the_epoch_it_was_asked_in(rig: Rig) -> None:
    items = _captured(rig)
    rig.b.leader.epoch = 4
    assert rig.b.promises.drain("n1", undo=False, migrate=True) == 1
    rig.b.promises.watch(rig.now)
    moved = _planned_alike(rig, items[-1])
    assert [e.message.epoch for e in moved.effects  # type: ignore[attr-defined]
            if isinstance(e, Publish)] == [4]


def test_a_service_pass_plans_what_the_part_knew_as_it_submitted_it(rig: Rig) -> None:
    deployed(rig, web(count=2))
    state = rig.b.ledger.state()
    view = View(state)
    svc = state.services["web"]
    view.put_service(msgspec.structs.replace(svc, count=3))
    rig.b.ledger.apply(view.change, "scale by hand", state.head)
    items = _captured(rig)
    rig.run(rig.b.services.watch(rig.now))
    [item] = items
    planned = _planned_alike(rig, item)
    assert len([line for line in planned.lines if " start " in line]) == 1


def test_a_deployment_is_judged_on_its_replicas_clocks_as_the_pass_saw_them(rig: Rig) -> None:
    deployed(rig, web(count=2, checks=True))
    place_waiting(rig, healthy=True)
    sweep(rig)  # healthy since now
    rig.now += 2 * UPDATE.min_healthy_s
    items = _captured(rig)
    rig.run(rig.b.services.watch(rig.now))
    [item] = items
    planned = _planned_alike(rig, item)
    assert planned.lines == ["service web: deployed version 1: 2 replicas healthy"]


def test_a_system_jobs_pass_plans_on_the_nodes_it_decided_on(rig: Rig) -> None:
    deployed(rig, Spec(name="agent", type="system", command=["run"], cpu=0.1,
                       memory_mb=16))
    items = _captured(rig)
    rig.b.systems.watch()
    [item] = items
    planned = _planned_alike(rig, item)
    assert sorted(line.split(" on ")[1] for line in planned.lines) == \
        [f"{n} (version 1)" for n in NODES]  # as heard then: none offline


def _verb(rig: Rig, verb: Callable[[], Any]) -> Item:
    """The item a deploy verb submits (the verb itself waits on, and is cancelled)."""
    items = _captured(rig)
    rig.loop.create_task(verb())
    rig.loop.run_until_complete(asyncio.sleep(0))
    waiting = [t for t in asyncio.all_tasks(rig.loop) if t not in rig.tasks]
    for t in waiting:  # the verb, and a deploy's commit it spawned
        t.cancel()
    rig.loop.run_until_complete(asyncio.gather(*waiting, return_exceptions=True))
    [item] = items
    return item


def test_the_deploy_verbs_plan_with_the_wall_clock_and_seed_of_their_asking(rig: Rig) -> None:
    deployed(rig, web(count=1))
    for verb in (lambda: rig.b.deploys.deploy(web(count=2, version="2")),
                 lambda: rig.b.deploys.scale("web", 3),
                 lambda: rig.b.deploys.rollback("web", 0),
                 lambda: rig.b.deploys.stop_service("web")):
        _planned_alike(rig, _verb(rig, verb))
    item = _verb(rig, lambda: rig.b.deploys.deploy(web(count=2, version="3")))
    rig.b.services.wall = lambda: datetime(2032, 1, 1, tzinfo=UTC)
    view = View(rig.b.ledger.state())
    item.plan(view)
    svc = view.change.services["web"]  # its version stamped when it was asked, in 2031
    assert svc is not None and svc.versions[-1].at.startswith("2031-")
