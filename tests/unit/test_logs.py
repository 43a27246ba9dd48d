"""Log formats: one JSON object per line with structured extras; secrets never written."""

from __future__ import annotations

import io
import json
import logging

from gavel.cli.logs import REDACTED, configure

SECRET = "hunter2-swordfish"


def emit(fmt: str, *records: tuple[str, tuple[object, ...], dict[str, object]]) -> list[str]:
    stream = io.StringIO()
    handler = configure(fmt, "INFO", secrets=[SECRET, ""], stream=stream)
    try:
        log = logging.getLogger("gavel.test")
        for msg, args, extra in records:
            log.info(msg, *args, extra=extra)
        try:
            raise RuntimeError(f"boom {SECRET}")
        except RuntimeError:
            log.exception("failed")
    finally:
        logging.getLogger().removeHandler(handler)
    return stream.getvalue().splitlines()


def test_json_lines_carry_extras() -> None:
    lines = emit("json", ("placed %s on %s", ("i1", "n1"),
                          {"instance": "i1", "winner": "n1", "bids": 3, "round_s": 0.01}))
    first = json.loads(lines[0])
    assert set(first) >= {"ts", "level", "logger", "msg", "instance", "winner", "bids",
                          "round_s"}
    assert first["msg"] == "placed i1 on n1" and first["bids"] == 3
    assert first["level"] == "INFO" and first["logger"] == "gavel.test"
    assert first["ts"].endswith("Z")
    last = json.loads(lines[-1])
    assert "RuntimeError" in last["exc"]
    assert all(isinstance(json.loads(line), dict) for line in lines)


def test_secrets_are_redacted_in_every_format() -> None:
    for fmt in ("json", "text"):
        lines = emit(fmt, ("token %s", (SECRET,), {"env": {"API_KEY": SECRET}}),
                     ("nested", (), {"items": [f"x{SECRET}y", object()]}))
        text = "\n".join(lines)
        assert SECRET not in text
        assert REDACTED in text


def test_other_libraries_write_warnings_only_unless_debugging() -> None:
    """A fresh machine's first matplotlib import logs "generated new fontManager" at INFO; on
    a command's stderr that line is noise an operator (and a test of the one sentence a bad
    flag gets) must not see."""
    for level, noisy in (("INFO", False), ("DEBUG", True)):
        stream = io.StringIO()
        handler = configure("text", level, stream=stream)
        try:
            logging.getLogger("matplotlib.font_manager").info("generated new fontManager")
            logging.getLogger("matplotlib").warning("a real warning")
            logging.getLogger("gavel.test").info("ours")
        finally:
            logging.getLogger().removeHandler(handler)
            logging.getLogger().setLevel(logging.WARNING)
            logging.getLogger("gavel").setLevel(logging.NOTSET)
        out = stream.getvalue()
        assert ("fontManager" in out) is noisy, level
        assert "a real warning" in out and "ours" in out
