"""Many `gavel` command lines run by one child process, each as `python -m gavel` would run it
- `gavel.cli.main.main(argv)` with its own working directory, environment, stdout, stderr and
exit status - for the tests that check dozens of refusals (exit 2, one sentence): starting an
interpreter and importing gavel is most of each one's cost, and the checks are of what the
command prints and returns, not of the interpreter. A command that would crash shows its
traceback on its stderr and exits 1, as the interpreter would have it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Line", "run_all"]

_CHILD = r"""
import contextlib, io, json, os, sys, traceback
from gavel.cli.main import main

def run(case):
    os.environ.clear()
    os.environ.update(base)
    os.environ.update(case["env"])
    os.chdir(case["cwd"])
    # Text streams over bytes, as the real ones are (a command may write to `.buffer`).
    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
                for _ in range(2))
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(case["argv"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
    out.flush()
    err.flush()
    return {"code": code, "stdout": out.buffer.getvalue().decode(errors="replace"),
            "stderr": err.buffer.getvalue().decode(errors="replace")}

base = dict(os.environ)
cases = json.load(sys.stdin)
if sys.argv[2] == "at-once":
    pids = []
    for k, case in enumerate(cases):
        pid = os.fork()
        if pid == 0:  # one line's process: its result in a file of its own, then gone
            try:
                with open(f"{sys.argv[1]}.{k}", "w") as f:
                    json.dump(run(case), f)
            finally:
                os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    results = []
    for k in range(len(cases)):  # a line whose process died unwritten fails the batch here
        with open(f"{sys.argv[1]}.{k}") as f:
            results.append(json.load(f))
else:
    results = [run(case) for case in cases]
with open(sys.argv[1], "w") as f:
    json.dump(results, f)
"""


@dataclass(frozen=True)
class Line:
    """One command line: its arguments, where it runs and what it adds to the environment."""

    argv: Sequence[str]
    cwd: Path
    env: Mapping[str, str] = field(default_factory=dict)


def run_all(lines: Sequence[Line], results: Path, env: Mapping[str, str] | None = None,
            timeout: float = 120, at_once: bool = False
            ) -> list[subprocess.CompletedProcess[str]]:
    """Each line's outcome, in order, as `subprocess.run` would report it (kept in the file
    `results`); `env` is the child's whole environment (this process's by default);
    `at_once`: the lines side by side (the module's docstring), else one after another."""
    cases = [{"argv": list(x.argv), "cwd": str(x.cwd), "env": dict(x.env)} for x in lines]
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(results),
                           "at-once" if at_once else "in-turn"],
                          input=json.dumps(cases), capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ if env is None else env))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return [subprocess.CompletedProcess(["gavel", *x.argv], r["code"], r["stdout"], r["stderr"])
            for x, r in zip(lines, json.loads(results.read_text()), strict=True)]
