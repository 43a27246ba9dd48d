"""A workload as the operator writes it: a job that runs to completion, or a service kept
running at its count.

Rules:
1. A spec is user input: every struct here forbids unknown fields (a typo is an error, not a
   silently ignored key) and every value is checked where the operator submits it, with a
   sentence naming the field, never on a node after an award.
2. Everything after the first release has a default, so a spec written before a field
   existed still means what it meant: a job (`type`), one instance (`count`), no health
   checks, the restart policy of its type.
3. Defaults follow Nomad's, which its users know: a job restarts in place up to 3 times in a
   day, a service up to 2 times in 30 minutes, each after a delay of 15 s that doubles (up to
   5 minutes); a check runs every 10 s with a 2 s timeout and fails the instance's health
   after 3 consecutive failures; a deploy replaces one replica at a time, each healthy for
   10 s before an old one stops, and rolls back when a new one is not healthy within 5
   minutes.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

import msgspec

from gavel.shared.affinity import Affinity
from gavel.shared.cron import fields_problem as schedule_fields
from gavel.shared.suffixes import too_wide

__all__ = [
    "JOB",
    "MAX_ARG_BYTES",
    "MAX_EXEC_BYTES",
    "MIN_CPU",
    "SERVICE",
    "SYSTEM",
    "Check",
    "Restart",
    "Route",
    "Spec",
    "Update",
    "Volume",
    "restart_policy",
]

NonNegFloat = Annotated[float, msgspec.Meta(ge=0.0)]
PosFloat = Annotated[float, msgspec.Meta(gt=0.0)]
#: A spec's name starts the ids of its instances, NATS subject tokens: no ".." (an empty token).
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=63,
                                   pattern=r"^[a-z0-9](?:[a-z0-9_-]|\.(?!\.))*$")]
PortName = Annotated[str, msgspec.Meta(min_length=1, max_length=32, pattern=r"^[a-z][a-z0-9_]*$")]
#: A label name (what `spread` names): what a node's labels may hold as a key.
LabelName = Annotated[str, msgspec.Meta(min_length=1, max_length=63)]

JOB = "job"
SERVICE = "service"
#: One instance on every node that could run it, following the fleet (`gavel.shared.systems`).
SYSTEM = "system"

#: The finest cpu a spec may ask for (a thousandth, as Kubernetes' millicpu): a node turns
#: cpu into cgroup shares and weights, and less rounds to nothing it can enforce or count.
MIN_CPU = 0.001
#: Linux's limit on one argument or one environment string, NUL included (MAX_ARG_STRLEN,
#: 32 pages): exec refuses a longer one with E2BIG whatever the stack allows.
MAX_ARG_BYTES = 131_072
#: What a spec's command and environment together may take (bytes, with each string's NUL):
#: half of the 2 MiB that exec allows under the usual 8 MiB stack limit, so the variables
#: the worker adds (ports, the instance's id and directory, its own environment) still fit.
MAX_EXEC_BYTES = 1 << 20


def _finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number")


class Restart(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """How a worker restarts a process in place before it hands the instance back.

    A job's process is restarted when it exits non-zero, a service's whenever it exits (or
    its checks fail past their threshold): up to `attempts` times within `interval_s`, the
    k-th restart after ``delay_s * backoff**(k-1)`` seconds (at most `max_delay_s`). Past
    that the instance is handed back to the broker, which re-auctions it elsewhere. A field
    left out takes its type's default (`restart_policy`)."""

    attempts: Annotated[int, msgspec.Meta(ge=0, le=100)] | None = None
    interval_s: PosFloat | None = None
    delay_s: NonNegFloat | None = None
    backoff: Annotated[float, msgspec.Meta(ge=1.0, le=10.0)] | None = None
    max_delay_s: NonNegFloat | None = None

    def __post_init__(self) -> None:
        for name in ("interval_s", "delay_s", "max_delay_s"):
            value = getattr(self, name)
            if value is not None:
                _finite(f"restart.{name}", value)

    def delay(self, k: int) -> float:
        """The wait before the `k`-th restart within the interval (k >= 1), of a resolved
        policy (`restart_policy`)."""
        assert self.delay_s is not None and self.backoff is not None \
            and self.max_delay_s is not None, "a policy resolved by restart_policy"
        return min(self.max_delay_s, self.delay_s * self.backoff ** max(0, k - 1))


#: The restart policy of each type, field by field, where the spec leaves one out (rule 3).
DEFAULT_RESTART = {JOB: Restart(attempts=3, interval_s=86_400.0, delay_s=15.0, backoff=2.0,
                                max_delay_s=300.0),
                   SERVICE: Restart(attempts=2, interval_s=1_800.0, delay_s=15.0, backoff=2.0,
                                    max_delay_s=300.0)}
DEFAULT_RESTART[SYSTEM] = DEFAULT_RESTART[SERVICE]  # an agent on every node: kept running


class Check(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """A health check the worker runs next to the process.

    ``http``: a GET of `path` on the instance's port `port` answers `status`; ``tcp``: the
    port accepts a connection; ``exec``: `command` exits 0. Each runs every `interval_s`,
    at most `timeout_s`, the first `grace_s` after the process started; `failures`
    consecutive failures make the instance unhealthy."""

    type: Literal["http", "tcp", "exec"]
    name: Annotated[str, msgspec.Meta(max_length=63)] = ""
    port: PortName | None = None
    path: Annotated[str, msgspec.Meta(max_length=1024)] = "/"
    status: Annotated[int, msgspec.Meta(ge=100, le=599)] = 200
    command: list[str] = []
    interval_s: PosFloat = 10.0
    timeout_s: PosFloat = 2.0
    grace_s: NonNegFloat = 0.0
    failures: Annotated[int, msgspec.Meta(ge=1, le=100)] = 3

    def __post_init__(self) -> None:
        for name in ("interval_s", "timeout_s", "grace_s"):
            _finite(f"checks.{name}", getattr(self, name))
        if self.type in ("http", "tcp") and self.port is None:
            raise ValueError(f"a {self.type} check names the port it checks (port = \"...\")")
        if self.type == "exec" and not self.command:
            raise ValueError("an exec check names its command (command = [...])")
        if self.type != "exec" and self.command:
            raise ValueError(f"a {self.type} check takes no command")
        if self.type == "http" and not self.path.startswith("/"):
            raise ValueError("an http check's path starts with /")
        if any("\0" in arg for arg in self.command):
            raise ValueError("check command arguments must not contain a NUL character")

    @property
    def label(self) -> str:
        """How events and `status` name this check."""
        if self.name:
            return self.name
        if self.type == "exec":
            return f"exec {self.command[0]}"
        return f"{self.type} {self.port}" + (self.path if self.type == "http" else "")


class Update(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """How a new version of a service replaces the running one (a rolling deploy).

    `max_parallel` replicas are replaced at a time: a new one is placed, and once it has been
    healthy for `min_healthy_s` an old one stops. A new replica not healthy within
    `healthy_deadline_s` fails the deploy; with `auto_revert` the service goes back to its
    last version that was healthy."""

    max_parallel: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 1
    min_healthy_s: NonNegFloat = 10.0
    healthy_deadline_s: PosFloat = 300.0
    auto_revert: bool = True

    def __post_init__(self) -> None:
        for name in ("min_healthy_s", "healthy_deadline_s"):
            _finite(f"update.{name}", getattr(self, name))


#: An image reference as Docker reads one: ``[registry[:port]/]path[:tag][@algo:hex]``,
#: lowercase path components (docker/distribution's reference grammar, simplified).
_IMAGE_REF = re.compile(
    r"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[a-z0-9]+:[a-f0-9]{32,})?$")
#: A host volume's name, as a worker's config names it.
VolumeName = Annotated[str, msgspec.Meta(min_length=1, max_length=63,
                                         pattern=r"^[a-z0-9][a-z0-9_.-]*$")]


class Volume(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """A host volume the workload uses: the node's directory named `name` in its worker's
    config, mounted at `path` in a container; a process is told its host path in
    ``GAVEL_VOLUME_<NAME>``. Only nodes that hold every named volume bid."""

    name: VolumeName
    path: Annotated[str, msgspec.Meta(max_length=1024)] = ""

    def __post_init__(self) -> None:
        if self.path and not self.path.startswith("/"):
            raise ValueError(f"volume {self.name!r}: its path is absolute (starts with /)")
        if "\0" in self.path or "," in self.path or ":" in self.path:
            raise ValueError(f"volume {self.name!r}: its path has no NUL, ',' or ':'")


class Spec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A workload as the operator writes it (TOML or JSON): a `command` run as a process, or
    an `image` run as a container (then `command`, when given, replaces the image's CMD and
    its ENTRYPOINT is kept, as ``docker run IMAGE COMMAND...`` does)."""

    name: Name
    command: list[str] = []
    #: An OCI image (``name:tag`` or a digest): the workload runs as a container.
    image: Annotated[str, msgspec.Meta(max_length=512)] | None = None
    #: ``job`` runs to completion; ``service`` keeps `count` replicas running until stopped.
    #: ``system`` keeps one instance running on every node that could run it.
    type: Literal["job", "service", "system"] = "job"
    #: A service's replicas; for a job, how many instances one submission makes (more than
    #: one: a batch array, `gavel.shared.arrays`).
    count: Annotated[int, msgspec.Meta(ge=0, le=100_000)] = 1
    #: A batch array's tasks running at once (None: all `count` at once); a job's only.
    parallelism: int | None = None
    #: A batch array's failure budget: tasks that may end failed (after their own restarts
    #: and attempts) before the array releases no more (None: 0, `arrays.DEFAULT_MAX_FAILURES`).
    max_failures: int | None = None
    env: dict[str, str] = {}
    cpu: PosFloat = 0.1
    memory_mb: Annotated[int, msgspec.Meta(ge=1)] = 64
    #: The most processes (threads included) the instance may hold at once: its cgroup's
    #: ``pids.max`` for a process, the engine's pids limit for a container.
    pids: Annotated[int, msgspec.Meta(ge=1, le=65_536)] = 512
    #: Run as root rather than a uid of its own: only on a node whose config allows it
    #: (``allow_root``); elsewhere the instance fails to start (`worker.isolation`).
    root: bool = False
    ports: list[PortName] = []
    labels: dict[str, str] = {}
    timeout_s: PosFloat | None = None
    #: Placements an instance may be given (re-auctions after a node failed it).
    attempts: Annotated[int, msgspec.Meta(ge=1, le=100)] = 3
    secrets: list[str] = []
    #: In-place restarts on the node (None: the type's default, `restart_policy`).
    restart: Restart | None = None
    checks: list[Check] = []
    #: A service's replicas spread evenly across this node label's values (they land on
    #: distinct nodes when the fleet allows it, whatever this says).
    spread: LabelName | None = None
    #: When the fleet cannot satisfy the spread: place anyway (True) or wait (False).
    spread_soft: bool = False
    update: Update = msgspec.field(default_factory=Update)
    #: How the gateway reaches this workload's replicas (`Route`, at the end of this file).
    routes: list[Route] = []
    #: Host volumes it uses (`Volume`).
    volumes: list[Volume] = []
    #: Soft preferences for nodes by label (`gavel.shared.affinity`): never a constraint.
    affinities: list[Affinity] = []
    #: A periodic job: a cron expression (`gavel.shared.cron`); each time it fires the broker
    #: submits one run of the job (`gavel.shared.periodic`). A job's only.
    schedule: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    #: The schedule's time zone, an IANA name (None: UTC).
    time_zone: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    #: A fire time while an earlier run still runs: ``skip`` it (None: the default) or
    #: ``allow`` the runs to overlap.
    overlap: Annotated[str, msgspec.Meta(max_length=16)] | None = None
    #: May a re-auction move it once it runs (`shared.reauction` rule 1)? None: a service's
    #: replicas may, jobs, system instances and those using volumes stay; true opts them
    #: in; false pins it where it runs.
    move: bool | None = None
    #: 1 (least) to 100 (most urgent): work that finds no room may displace work at least
    #: `gavel.shared.preemption.GAP` below it (`gavel.shared.preemption`).
    priority: Annotated[int, msgspec.Meta(ge=1, le=100)] = 50

    def __post_init__(self) -> None:
        if not self.command and self.image is None:
            raise ValueError("a spec runs a command (command = [...]) or an image (image = "
                             "\"name:tag\"); this one names neither")
        if self.image is not None and not _IMAGE_REF.match(self.image):
            raise ValueError(f"image {self.image!r} is not an image reference (name:tag, or "
                             "name@sha256:<digest>, lowercase name)")
        names = [v.name for v in self.volumes]
        if len(set(names)) != len(names):
            raise ValueError("volumes must name distinct host volumes")
        if self.image is not None and any(not v.path for v in self.volumes):
            raise ValueError("a container's volume names the path it is mounted at "
                             "(path = \"/...\")")
        # What exec would refuse only on the node (after an award, as "driver failed to
        # start") is refused here, where the operator submits it.
        if len(set(self.ports)) != len(self.ports):
            raise ValueError("ports must have distinct names")
        if len(set(self.secrets)) != len(self.secrets):
            raise ValueError("secrets must have distinct names")
        if not math.isfinite(self.cpu):
            raise ValueError("cpu must be a finite number")
        if self.cpu < MIN_CPU:
            raise ValueError(f"cpu {self.cpu:g} is below the finest a node divides: at least "
                             f"{MIN_CPU:g}")
        if self.timeout_s is not None and not math.isfinite(self.timeout_s):
            raise ValueError("timeout_s must be a finite number of seconds (leave it out for "
                             "no timeout)")
        if any("\0" in arg for arg in self.command):
            raise ValueError("command arguments must not contain a NUL character")
        for key, value in self.env.items():
            if not key or "=" in key or "\0" in key or "\0" in value:
                raise ValueError(f"env name {key!r} is not usable: a name is not empty and has "
                                 "no '=' or NUL, a value has no NUL")
        if any(not key for key in self.labels):
            raise ValueError("label names must not be empty")
        for key, value in self.labels.items():
            if _control(key) or _control(value):
                raise ValueError(f"label {key!r} = {value!r} holds a control character (a "
                                 "newline, a tab, ...): no node's label can match it")
        if len({(a.label, a.value) for a in self.affinities}) != len(self.affinities):
            raise ValueError("affinities must name distinct label and value pairs")
        if self.spread is not None and _control(self.spread):
            raise ValueError(f"spread {self.spread!r} holds a control character: no node's "
                             "label can match it")
        _exec_fits(self.command, self.env)
        for check in self.checks:
            if check.port is not None and check.port not in self.ports:
                raise ValueError(f"check {check.label!r} names port {check.port!r}, which the "
                                 "spec does not declare in ports")
        if self.type != SERVICE and (self.spread is not None or self.spread_soft):
            raise ValueError("spread applies to a service's replicas (type = \"service\")")
        if self.type == SYSTEM and self.count != 1:
            raise ValueError("count does not apply to a system job (type = \"system\"): it "
                             "runs one instance on every node that could run it")
        if self.type == JOB and self.count == 0:
            raise ValueError("a job's count is at least 1 (a service may have 0 replicas)")
        _array_fields(self.type, self.parallelism, self.max_failures)
        problem = schedule_fields(self.type, self.count, self.schedule, self.time_zone,
                                  self.overlap)
        if problem:
            raise ValueError(problem)
        if self.schedule is not None:  # a run is one instance, never a batch array
            for array_field, given in (("parallelism", self.parallelism),
                                       ("max_failures", self.max_failures)):
                if given is not None:
                    raise ValueError(f"{array_field} does not apply to a periodic job: each run is "
                                     "one instance, not a batch array")
        seen: set[tuple[str, str]] = set()
        for route in self.routes:
            if route.port is not None and route.port not in self.ports:
                raise ValueError(f"route {route.label!r} names port {route.port!r}, which the "
                                 "spec does not declare in ports")
            if route.key in seen:
                raise ValueError(f"two routes of the spec match {route.label!r}: give each "
                                 "route its own host or path")
            seen.add(route.key)

    @property
    def service(self) -> bool:
        """Kept running under a service record (``services/<name>.json``): a service, or a
        system job (one instance a node instead of `count`)."""
        return self.type in (SERVICE, SYSTEM)

    @property
    def system(self) -> bool:
        return self.type == SYSTEM


def _array_fields(kind: str, parallelism: int | None, max_failures: int | None) -> None:
    """A batch array's fields: a job's only, and each within its range."""
    for field, value, least in (("parallelism", parallelism, 1),
                                ("max_failures", max_failures, 0)):
        if value is None:
            continue
        if kind != JOB:
            raise ValueError(f"{field} applies to a job's batch array (type = \"job\"), not "
                             f"to a {kind}")
        if not least <= value <= 100_000:
            raise ValueError(f"{field} {value} is out of range: {least} .. 100000")


def _control(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def _exec_fits(command: list[str], env: dict[str, str]) -> None:
    """What exec would refuse with E2BIG on every node, refused where it is submitted."""
    for arg in command:
        if len(arg.encode(errors="surrogatepass")) + 1 > MAX_ARG_BYTES:
            raise ValueError(f"a command argument of {len(arg.encode(errors='surrogatepass'))} "
                             f"bytes is over the kernel's limit for one argument "
                             f"({MAX_ARG_BYTES - 1} bytes): exec would refuse it (E2BIG)")
    for key, value in env.items():
        if len(f"{key}={value}".encode(errors="surrogatepass")) + 1 > MAX_ARG_BYTES:
            raise ValueError(f"env {key!r} is over the kernel's limit for one variable "
                             f"({MAX_ARG_BYTES - 1} bytes): exec would refuse it (E2BIG)")
    total = sum(len(a.encode(errors="surrogatepass")) + 1 for a in command) + sum(
        len(f"{k}={v}".encode(errors="surrogatepass")) + 1 for k, v in env.items())
    if total > MAX_EXEC_BYTES:
        raise ValueError(f"the command and env take {total} bytes, over the {MAX_EXEC_BYTES} "
                         "a spec may give exec (the kernel's limit, less room for the "
                         "worker's variables): exec would refuse it (E2BIG)")


def restart_policy(spec: Spec) -> Restart:
    """The spec's restart policy with every field it leaves out taken from its type's default
    (rule 3): every field of the answer is set."""
    default = DEFAULT_RESTART[spec.type]
    given = spec.restart
    if given is None:
        return default
    return Restart(**{f: getattr(given, f) if getattr(given, f) is not None
                      else getattr(default, f) for f in Restart.__struct_fields__})


#: One DNS label: letters (lowercase), digits and '-', neither first nor last (RFC 1123).
_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
#: What a path prefix may hold: an URL path's characters, never a pattern (``*``), a query
#: (``?``), a fragment (``#``), an escape (``%``) or a blank.
_PATH = re.compile(r"^/[A-Za-z0-9._~!$&'()+,;=:@/-]*$")


def _dns_name(host: str) -> bool:
    """A DNS name Caddy can match on: dot-separated labels, at most 253 characters; the first
    label may be ``*`` (every name one label deeper)."""
    labels = host.split(".")
    if labels[0] == "*" and len(labels) > 1:
        labels = labels[1:]
    return len(host) <= 253 and all(_LABEL.match(label) for label in labels)


def _segments(path: str) -> list[str]:
    return [s for s in path.split("/") if s]


class Route(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, frozen=True):
    """How the gateway (`gavel gateway`, a Caddy) reaches this workload: a request for
    `host` and/or under the path prefix `path` is proxied to the port `port` of every
    healthy running replica (balanced across them), or answered from the directory `files`:
    relative, a directory inside the instance's own directory on its node (what the
    instance writes there); absolute, a static root on the gateway's host. `strip_prefix`
    takes `path` off the request before it is proxied or looked up: by default a files
    route's directory is mounted at its path (``/static/app.js`` is ``app.js`` in it) and a
    port route's replicas see the path as it came.

    Rules: a route names a host, a path or both, and exactly one of `port` and `files`; a
    host is a DNS name, a path starts with ``/``; neither `path` nor `files` may climb out
    with ``..``; a wildcard host (``*.`` leading, one label) never covers a public suffix
    alone (`gavel.shared.suffixes`)."""

    host: Annotated[str, msgspec.Meta(max_length=253)] = ""
    path: Annotated[str, msgspec.Meta(max_length=1024)] = ""
    port: PortName | None = None
    files: Annotated[str, msgspec.Meta(max_length=4096)] | None = None
    strip_prefix: bool | None = None

    def __post_init__(self) -> None:
        if not self.host and not self.path:
            raise ValueError("a route names a host, a path prefix or both (host = \"...\", "
                             "path = \"/...\")")
        if self.host and not _dns_name(self.host):
            raise ValueError(f"route host {self.host!r} is not a valid DNS name (lowercase "
                             "letters, digits and '-' in dot-separated labels of at most 63, "
                             "'*.' may lead)")
        if too_wide(self.host):
            raise ValueError(f"route host {self.host!r} covers a public suffix: a wildcard "
                             "covers one label under a domain of one's own (*.example.com)")
        if self.path and not self.path.startswith("/"):
            raise ValueError(f"route path {self.path!r} must start with /")
        if self.path and not _PATH.match(self.path):
            raise ValueError(f"route path {self.path!r} may hold only the characters of an "
                             "URL path: no blank, '*', '?', '#' or '%'")
        if any(s in (".", "..") for s in _segments(self.path)):
            raise ValueError(f"route path {self.path!r} must not hold a '.' or '..' segment")
        if (self.port is None) == (self.files is None):
            raise ValueError("a route reaches a port (port = \"...\") or serves files "
                             f"(files = \"...\"): {'not both' if self.port else 'give it one'}")
        if self.files is not None:
            if not self.files.strip() or "\0" in self.files:
                raise ValueError("a route's files name a directory (relative: inside the "
                                 "instance's directory; absolute: a static root)")
            if ".." in _segments(self.files):
                raise ValueError(f"route files {self.files!r} must not climb out with '..'")
        if self.strip_prefix and not self.path:
            raise ValueError("strip_prefix takes a route's path off the request: give the "
                             "route a path")

    @property
    def strips(self) -> bool:
        """Whether the gateway takes the path prefix off (`strip_prefix`, or the default of
        the route's kind)."""
        if self.strip_prefix is not None:
            return self.strip_prefix
        return self.files is not None and bool(self.path)

    @property
    def prefix(self) -> str:
        """The path prefix as matched: no trailing slash ("/" matches every path)."""
        return (self.path.rstrip("/") or "/") if self.path else ""

    @property
    def key(self) -> tuple[str, str]:
        """What the route matches: its host and its path prefix."""
        return (self.host, self.prefix)

    @property
    def label(self) -> str:
        """How `gavel routes` and refusals name the route: ``host/path``."""
        return f"{self.host}{self.prefix}"
