"""Log lines for people (text) or for log stacks (JSON, one object per line).

Rules:
1. A JSON line has ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``msg`` and every field a
   caller passed with ``extra={...}``; values JSON cannot hold are written as strings.
2. Secret values never reach a log line: every value registered with `configure` (secrets,
   passwords in URLs, push tokens) is replaced by ``[redacted]`` in the message, the extras
   and any traceback, whatever the format.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, TextIO

__all__ = ["REDACTED", "JsonFormatter", "TextFormatter", "configure"]

REDACTED = "[redacted]"
#: Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName"}


class _Redacting(logging.Formatter):
    def __init__(self, secrets: Iterable[str] = (), fmt: str | None = None) -> None:
        super().__init__(fmt)
        # Longest first, so a secret that contains another is redacted whole.
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        for s in self.secrets:
            if s in text:
                text = text.replace(s, REDACTED)
        return text


class TextFormatter(_Redacting):
    """``2024-05-01 12:00:00,123 gavel.broker INFO placed ...``"""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__(secrets, "%(asctime)s %(name)s %(levelname)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        return self.redact(super().format(record))


class JsonFormatter(_Redacting):
    """One JSON object per line: ts, level, logger, msg, then the structured extras."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": self.redact(record.getMessage()),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key not in out:
                out[key] = self._value(value)
        if record.exc_info:
            out["exc"] = self.redact(self.formatException(record.exc_info))
        elif record.exc_text:
            out["exc"] = self.redact(record.exc_text)
        return json.dumps(out, ensure_ascii=False, default=str)

    def _value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact(value)
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, list | tuple):
            return [self._value(v) for v in value]
        if isinstance(value, dict):
            return {str(k): self._value(v) for k, v in value.items()}
        return self.redact(str(value))


def configure(fmt: str = "text", level: str = "INFO", secrets: Iterable[str] = (),
              stream: TextIO | None = None) -> logging.Handler:
    """Replace the root handlers with one writing `fmt` lines to `stream` (stderr).

    `level` is gavel's own (the ``gavel.*`` loggers); other libraries write their warnings
    and errors only (matplotlib announcing its font cache is not an operator's business),
    unless `level` is DEBUG."""
    handler = logging.StreamHandler(stream or sys.stderr)
    formatter: logging.Formatter = (JsonFormatter(secrets) if fmt == "json"
                                    else TextFormatter(secrets))
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level if level == "DEBUG" else max(logging.WARNING,
                                                     logging.getLevelName(level)))
    logging.getLogger("gavel").setLevel(level)
    return handler
