"""Parsers for option values, shared by flags (argparse ``type=``) and GAVEL_* variables.

Rule: each takes the text an operator typed and returns the typed value, or raises
`argparse.ArgumentTypeError` with one sentence naming the text and what was expected.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from gavel.shared.routes import usable_address

#: A number an option may be (`at_most`).
N = TypeVar("N", int, float)

__all__ = [
    "WAIT_MODES",
    "absolute_paths",
    "address",
    "admin_url",
    "at_most",
    "boolean",
    "broker_id",
    "choice",
    "duration",
    "engine",
    "label_keys",
    "labels",
    "listen_addresses",
    "listen_port",
    "node_id",
    "non_negative_float",
    "port",
    "port_list",
    "port_range",
    "positive_float",
    "positive_int",
    "strategy_param",
    "strategy_params",
    "unusable_dir",
    "volumes",
    "wait_mode",
    "whole",
]

def labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"label {part!r} is not of the form key=value")
        out[key] = value
    return out


def volumes(text: str) -> dict[str, str]:
    """Host volumes as ``name=/abs/path,name2=/other``: what a spec's `volumes` may name."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, path = part.partition("=")
        if not sep or not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,62}", name):
            raise argparse.ArgumentTypeError(
                f"volume {part!r} is not of the form name=/path (a lowercase name)")
        if not path.startswith("/"):
            raise argparse.ArgumentTypeError(f"volume {name!r}: {path!r} is not an absolute path")
        out[name] = path
    return out


def engine(text: str) -> str:
    """``auto``, ``off``, or the engine's URL (``unix:///path``, ``tcp://host:port``)."""
    if text in ("auto", "off") or re.fullmatch(r"(unix://)?/\S+|(tcp|http|https)://\S+", text):
        return text
    raise argparse.ArgumentTypeError(
        f"engine {text!r} is neither auto, off nor a Docker host URL (unix:///var/run/"
        "docker.sock, tcp://host:port)")


def label_keys(text: str) -> list[str]:
    """A comma list of label keys, e.g. ``gpu,ssd``: each as in ``--labels`` before its '='."""
    keys = [k.strip() for k in text.split(",") if k.strip()]
    for key in keys:
        if "=" in key:
            raise argparse.ArgumentTypeError(
                f"{key!r} is a label, not a label key: name the key alone (gpu, not gpu=yes)")
    return keys


def address(text: str) -> str:
    """An address other hosts reach this one at: an IPv4 or IPv6 address, or a DNS name."""
    if not usable_address(text):
        raise argparse.ArgumentTypeError(
            f"address {text!r} is neither an IP address nor a DNS name")
    try:
        return str(ipaddress.ip_address(text))  # one spelling of each address
    except ValueError:
        return text


def admin_url(text: str) -> str:
    """Caddy's admin API: ``http://HOST:PORT`` (a path after it is refused), or its unix
    socket ``unix:///absolute/path``."""
    if text.startswith("unix://"):
        if not text.removeprefix("unix://").startswith("/") or "\0" in text:
            raise argparse.ArgumentTypeError(
                f"admin URL {text!r} is not of the form unix:///absolute/path")
        return text
    try:
        parts = urlsplit(text)
        good = parts.scheme in ("http", "https") and bool(parts.hostname) and \
            parts.path in ("", "/") and not parts.query and not parts.fragment
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError:
        good = False
    if not good:
        raise argparse.ArgumentTypeError(
            f"admin URL {text!r} is not of the form http://HOST:PORT or unix:///PATH")
    return text.rstrip("/")


def listen_addresses(text: str) -> list[str]:
    """Caddy listen addresses, a comma list of ``[HOST]:PORT`` (``:8080``, ``[::1]:80``)."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        host, sep, number = part.rpartition(":")
        bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not sep or not number.isdigit() or not 1 <= int(number) <= 65535 or (
                bare and not _is_address(bare)):
            raise argparse.ArgumentTypeError(
                f"listen address {part!r} is not of the form [HOST]:PORT")
        out.append(part)
    return out


def absolute_paths(text: str) -> list[str]:
    out = [p.strip() for p in text.split(",") if p.strip()]
    for p in out:
        if not p.startswith("/"):
            raise argparse.ArgumentTypeError(f"{p!r} is not an absolute path")
    return out


def _is_address(text: str) -> bool:
    try:
        address(text)
    except argparse.ArgumentTypeError:
        return False
    return True


def node_id(text: str) -> str:
    if not re.match(r"^[A-Za-z0-9_-]{1,64}$", text):
        raise argparse.ArgumentTypeError(
            f"node id {text!r} must be 1-64 letters, digits, '-' or '_' (it becomes one NATS "
            "subject token)")
    return text


def broker_id(text: str) -> str:
    if not re.match(r"^[A-Za-z0-9_-]{1,64}$", text):
        raise argparse.ArgumentTypeError(
            f"broker id {text!r} must be 1-64 letters, digits, '-' or '_'")
    return text


def boolean(text: str) -> bool:
    """A switch's value in the environment: 1/true/yes/on or 0/false/no/off."""
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not one of 1, true, yes, on, 0, false, "
                                     "no, off")


def _number(text: str, kind: type[float] | type[int], zero_ok: bool) -> float:
    """`text` as a `kind` above 0 (or at least 0 with `zero_ok`), finite; else one sentence."""
    try:
        value = kind(text)
    except ValueError:
        noun = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
    if not (value >= 0 if zero_ok else value > 0):  # NaN fails both
        bound = "be 0 or more" if zero_ok else "be greater than 0"
        raise argparse.ArgumentTypeError(f"{text!r} must {bound}")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number")
    return value


def positive_float(text: str) -> float:
    return float(_number(text, float, zero_ok=False))


def non_negative_float(text: str) -> float:
    return float(_number(text, float, zero_ok=True))


#: What `submit --wait` waits for: a job's end, or running and healthy.
WAIT_MODES = ("end", "running")


def wait_mode(text: str) -> str:
    """`submit --wait=MODE`: ``end`` (a job's end) or ``running`` (running and healthy)."""
    if text not in WAIT_MODES:
        raise argparse.ArgumentTypeError(f"{text!r} is not a wait: say --wait=end or "
                                         "--wait=running")
    return text


def at_most(parse: Callable[[str], N], most: N) -> Callable[[str], N]:
    """`parse`, and no more than `most`."""
    def bounded(text: str) -> N:
        value = parse(text)
        if value > most:
            raise argparse.ArgumentTypeError(f"{text!r} must be at most {most:g}")
        return value
    return bounded


def positive_int(text: str) -> int:
    return int(_number(text, int, zero_ok=False))


def whole(text: str) -> int:
    """A whole number, 0 or more."""
    return int(_number(text, int, zero_ok=True))


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def duration(text: str) -> float:
    """``90s``, ``5m``, ``1h30m``, ``2d`` (or plain seconds: ``90``) as seconds above 0."""
    t = text.strip().lower()
    try:
        seconds = float(t) if re.fullmatch(r"\d+(?:\.\d+)?", t) else None
    except ValueError:
        seconds = None
    if seconds is None and t and _PART.sub("", t) == "":
        seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(t))
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise argparse.ArgumentTypeError(
            f"duration {text!r} is not of the form 30s, 5m, 1h30m or 2d (above 0)")
    return seconds


def unusable_dir(path: Path, write: bool = False) -> str | None:
    """Why `path` cannot be a directory gavel keeps files in (made if missing; with `write`,
    a file is written and removed there too), or None if it can."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        if write:
            probe = path / ".gavel-write-check"
            probe.write_bytes(b"")
            probe.unlink()
    except OSError as exc:
        return str(exc.strerror or exc)
    return None


def port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (1-65535)")
    return value


def listen_port(text: str) -> int:
    """A port to listen on: 1-65535, or 0 for a free one."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0-65535; 0: a free "
                                         "one)")
    return value


def port_list(text: str) -> list[int]:
    """A comma list of TCP ports."""
    return [port(p.strip()) for p in text.split(",") if p.strip()]


def port_range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("-")
    if not sep:
        raise argparse.ArgumentTypeError(f"port range {text!r} is not of the form FIRST-LAST")
    a, b = port(lo), port(hi)
    if a > b:
        raise argparse.ArgumentTypeError(f"port range {text!r} ends before it starts")
    return a, b


#: The highest uid an instance may be given (below the kernel's (uid_t)-1 and -2).
UID_MAX = 4_294_967_293


def uid_range(text: str) -> tuple[int, int]:
    """FIRST-LAST uids for instances (`worker.isolation`): never 0, FIRST <= LAST."""
    lo, sep, hi = text.partition("-")
    try:
        if not sep:
            raise ValueError
        a, b = int(lo), int(hi)
    except ValueError:
        raise argparse.ArgumentTypeError(f"uid range {text!r} is not of the form FIRST-LAST"
                                         ) from None
    if not 1 <= a <= b <= UID_MAX:
        raise argparse.ArgumentTypeError(f"uid range {text!r} must lie in 1-{UID_MAX} and "
                                         "end at or after its start")
    return a, b


def strategy_param(text: str) -> tuple[str, float]:
    key, sep, value = text.partition("=")
    try:
        if not sep or not key:
            raise ValueError
        return key, float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"strategy parameter {text!r} is not of the form key=number") from None


def strategy_params(text: str) -> dict[str, float]:
    return dict(strategy_param(p.strip()) for p in text.split(",") if p.strip())


def choice(values: Sequence[str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in values:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not one of {', '.join(values)}")
        return text
    return parse
