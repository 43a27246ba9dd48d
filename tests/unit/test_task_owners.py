"""The house's rule, read from the code: every task of a long-lived part has an owner
(`transport.tasks`). In every room that runs tasks (the broker, the worker, the transport,
the gateway, the client and the command), a bare `asyncio.create_task`/`ensure_future`
stays only where the function that starts it awaits or cancels it before it returns (a wait
for the first of several things); each such site is listed here with why. A task group's own
`create_task` is owned by its group.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROOMS = ("broker", "worker", "transport", "gateway", "client", "cli")
#: File -> bare spawns that are scoped to the function starting them, and why.
SCOPED: dict[str, tuple[int, str]] = {
    "broker/ha.py": (1, "a leadership's ends (lease lost, fenced, a stop): whichever comes first"),
    "worker/instance.py": (1, "the process's exit, or its checks' verdict"),
    "worker/probes.py": (1, "one check's run, cancelled and awaited by its loop"),
    "transport/client.py": (1, "an answer, or the server's refusal of the request"),
    "gateway/keeper.py": (1, "a sleep cut short by the first of its events"),
    "client/aio.py": (1, "a log read, pumped while its iterator is read, ended with it"),
    "cli/daemons.py": (1, "the broker's run, awaited; cancelled while it still connects"),
    "cli/up.py": (2, "the workers' start, or a stop: whichever comes first"),
    "cli/commands.py": (2, "the events followed, or a signal: whichever comes first"),
    "cli/execcmd.py": (1, "the session, awaited; a signal cancels it (a hang-up)"),
    "cli/api/app.py": (1, "a log's next chunk, awaited beside the keep-alive"),
    "cli/ui/http.py": (2, "an event stream, or its browser's going: whichever comes first"),
    "transport/execclient.py": (1, "a session's output, heard until it ends or its input "
                                "crashes"),
}


def bare_spawns(path: Path) -> int:
    """Calls of `asyncio.create_task`/`ensure_future` or a loop's `create_task` (not a
    task group's)."""
    found = 0
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name, owner = node.func.attr, node.func.value
        grouped = isinstance(owner, ast.Name) and owner.id == "group"
        found += name == "ensure_future" or (name == "create_task" and not grouped)
    return found


def test_every_task_of_a_part_has_an_owner() -> None:
    counts: Counter[str] = Counter()
    for room in ROOMS:
        for path in sorted((ROOT / room).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "transport/tasks.py":
                continue
            if n := bare_spawns(path):
                counts[rel] = n
    unowned = {f: n for f, n in counts.items() if n > SCOPED.get(f, (0, ""))[0]}
    assert not unowned, (
        f"tasks without an owner in {sorted(unowned)}: spawn them on the part's "
        "transport.tasks.Tasks (or a TaskGroup of the loop they belong to)")
    stale = {f for f, (n, _) in SCOPED.items() if counts[f] < n}
    assert not stale, f"SCOPED lists more bare spawns than {sorted(stale)} has; lower it"


def test_the_rule_sees_a_bare_spawn(tmp_path: Path) -> None:
    module = tmp_path / "part.py"
    module.write_text("import asyncio\n"
                      "async def f(group, loop):\n"
                      "    asyncio.create_task(g())\n"
                      "    asyncio.ensure_future(g())\n"
                      "    loop.create_task(g())\n"
                      "    group.create_task(g())\n")
    assert bare_spawns(module) == 3
