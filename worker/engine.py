"""The node's container engine: a Docker Engine API client, found once at start, and what
the node can run with it (images held, host volumes).

Rules:
1. The engine is found at start: `connect` pings the configured socket (``auto``: the
   ``DOCKER_HOST`` of the worker's environment, else ``/var/run/docker.sock``) and gives
   None, said once, where none answers; a node without one declines image specs
   (`Reason.NO_ENGINE`). The client that runs containers is the Docker SDK for Python
   (``docker``): the Engine API's own client, the one testcontainers drives, so the suite and
   the worker speak to the engine through one well-kept library. Its calls block: they run
   on the engine's own threads, never on the event loop.
2. The SDK (and requests under it) costs an idle worker more memory than its target allows,
   so it is imported when the first container starts or is re-adopted (`client`); until
   then the two questions an idle worker asks - is there an engine, which images does it
   hold - are plain GETs of the Engine API (``/version``, ``/images/json``) over the
   standard library's http.client, which the worker has loaded anyway.
3. What the node holds is learned at start and at every heartbeat: each image's tags,
   repository digests and id. A bid says whether the node holds the spec's image
   (`shared.feasibility.NodeView.images`).
4. Everything gavel creates in the engine carries the labels `LABELS`: the node, the
   worker's state directory (``home``: two clusters sharing one engine never touch each
   other's containers), the instance and its attempt.
5. An engine that did not answer at start (a dockerd still starting, slower than the
   worker) is asked again every heartbeat, quietly, unless the setting is ``off``; until it
   answers, image specs are declined and containers an earlier worker left are held, not
   given up (`worker.drivers` rule 3). Once it answers the node bids on images.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import logging
import os
import socket
from typing import Any
from urllib.parse import urlsplit

from gavel.shared.timing import Timing

__all__ = ["ATTEMPT", "HOME", "INSTANCE", "NODE", "Engine", "connect", "get"]

log = logging.getLogger("gavel.worker.engine")

NODE, HOME, INSTANCE, ATTEMPT = ("gavel.node", "gavel.home", "gavel.instance", "gavel.attempt")
LABELS = (NODE, HOME, INSTANCE, ATTEMPT)
_DEFAULT_SOCKET = "unix:///var/run/docker.sock"
#: The Engine API's waits: machine waits of `Timing` (`shared.timing` rule 3).
_TIMING = Timing()
#: Threads for the engine's short calls (create, start, stop, remove, exec, inspect).
_CALL_THREADS = 8


class Engine:
    """A connected engine and what this node holds in it (rules 2-4)."""

    def __init__(self, *, node_id: str, home: str, version: str, url: str,
                 timing: Timing = _TIMING) -> None:
        self._client: Any = None
        #: The Engine API's waits (`Timing.engine_call_s`, `Timing.engine_ask_s`).
        self.timing = timing
        self.node_id = node_id
        self.home = home
        self.version = version
        self.url = url
        self.images: frozenset[str] = frozenset()
        self.calls = concurrent.futures.ThreadPoolExecutor(
            _CALL_THREADS, thread_name_prefix="gavel-engine")

    @property
    def client(self) -> Any:
        """The SDK's client, made at first use (rule 2); blocking: call it from a thread."""
        if self._client is None:
            import docker

            self._client = docker.DockerClient(base_url=self.url,
                                               timeout=self.timing.engine_call_s,
                                               max_pool_size=64)
        return self._client

    def labels(self, instance_id: str = "", attempt: int = 0) -> dict[str, str]:
        out = {NODE: self.node_id, HOME: self.home}
        if instance_id:
            out[INSTANCE], out[ATTEMPT] = instance_id, str(attempt)
        return out

    def filters(self, instance_id: str = "") -> dict[str, Any]:
        """The engine's label filter for this worker's containers (of one instance)."""
        labels = self.labels()
        if instance_id:
            labels[INSTANCE] = instance_id
        return {"label": [f"{k}={v}" for k, v in labels.items()]}

    def refresh_images(self) -> frozenset[str]:
        """Rule 3 (blocking: call it from a thread, or at start)."""
        names: set[str] = set()
        for image in get(self.url, "/images/json", self.timing.engine_ask_s):
            names.update(t for t in image.get("RepoTags") or () if t != "<none>:<none>")
            names.update(image.get("RepoDigests") or ())
            names.add(image["Id"])
        self.images = frozenset(names)
        return self.images

    def close(self) -> None:
        self.calls.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            self._client.close()


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def get(url: str, path: str, timeout: float = _TIMING.engine_ask_s) -> Any:
    """One GET of the Engine API at `url` (``unix://`` or ``tcp://``/``http://``): its JSON
    (rule 2). Raises OSError, or ValueError for an answer that is not a 200 with JSON."""
    if url.startswith("unix://"):
        conn: http.client.HTTPConnection = _UnixConnection(url[len("unix://"):], timeout)
    else:
        parts = urlsplit(url.replace("tcp://", "http://", 1))
        conn = http.client.HTTPConnection(parts.hostname or "localhost", parts.port or 2375,
                                          timeout=timeout)
    try:
        conn.request("GET", path, headers={"Host": "docker"})
        resp = conn.getresponse()
        body = resp.read()
    except http.client.HTTPException as exc:
        raise OSError(f"not an Engine API answer: {exc}") from exc
    finally:
        conn.close()
    if resp.status != 200:
        raise ValueError(f"{path}: HTTP {resp.status}")
    return json.loads(body)


def connect(setting: str, *, node_id: str, home: str,
            env: dict[str, str] | None = None, quiet: bool = False,
            timing: Timing = _TIMING) -> Engine | None:
    """The engine `setting` names (``auto``, ``off`` or a Docker host URL), or None (rule 1);
    `quiet`: asked again (rule 5), an engine still missing is not said again."""
    if setting == "off":
        return None
    environ = os.environ if env is None else env
    url = setting if setting != "auto" else environ.get("DOCKER_HOST") or _DEFAULT_SOCKET
    if url.startswith("unix://") and not os.path.exists(url[len("unix://"):]):
        if not quiet:
            log.info("no container engine: %s does not exist; image specs are declined", url)
        return None
    try:
        version = str(get(url, "/version", timing.engine_ask_s).get("Version", "?"))
    except (OSError, ValueError) as exc:
        if not quiet:
            log.warning("no container engine answers at %s (%s); image specs are declined "
                        "until one does", url, exc)
        return None
    engine = Engine(node_id=node_id, home=home, version=version, url=url, timing=timing)
    try:
        engine.refresh_images()
    except (OSError, ValueError) as exc:
        log.warning("cannot list the engine's images: %s", exc)
    log.info("container engine %s at %s, %d image names held", version, url,
             len(engine.images))
    return engine
