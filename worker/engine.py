"""The node's container engine: a Docker Engine API client, found once at start, and what
the node can run with it (images held, host volumes).

Rules:
1. The engine is found at start: `connect` pings the configured socket (``auto``: the
   ``DOCKER_HOST`` of the worker's environment, else ``/var/run/docker.sock``) and gives
   None, said once, where none answers; a node without one declines image specs
   (`Reason.NO_ENGINE`). The client is the Docker SDK for Python (``docker``): the Engine
   API's own client, the one testcontainers drives, so the suite and the worker speak to the
   engine through one well-kept library. Its calls block: they run on the engine's own
   threads, never on the event loop.
2. What the node holds is learned at start and after every start of a container: each image's
   tags, repository digests and id. A bid says whether the node holds the spec's image
   (`shared.feasibility.NodeView.images`).
3. Everything gavel creates in the engine carries the labels `LABELS`: the node, the
   worker's state directory (``home``: two clusters sharing one engine never touch each
   other's containers), the instance and its attempt.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
from typing import Any

__all__ = ["ATTEMPT", "HOME", "INSTANCE", "NODE", "Engine", "connect"]

log = logging.getLogger("gavel.worker.engine")

NODE, HOME, INSTANCE, ATTEMPT = ("gavel.node", "gavel.home", "gavel.instance", "gavel.attempt")
LABELS = (NODE, HOME, INSTANCE, ATTEMPT)
_DEFAULT_SOCKET = "unix:///var/run/docker.sock"
#: Threads for the engine's short calls (create, start, stop, remove, exec, inspect).
_CALL_THREADS = 8


class Engine:
    """A connected engine and what this node holds in it (rules 2, 3)."""

    def __init__(self, client: Any, *, node_id: str, home: str, version: str,
                 url: str) -> None:
        self.client = client
        self.node_id = node_id
        self.home = home
        self.version = version
        self.url = url
        self.images: frozenset[str] = frozenset()
        self.calls = concurrent.futures.ThreadPoolExecutor(
            _CALL_THREADS, thread_name_prefix="gavel-engine")

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
        """Rule 2 (blocking: call it from a thread, or at start)."""
        names: set[str] = set()
        for image in self.client.images.list():
            names.update(image.tags)
            names.update(image.attrs.get("RepoDigests") or ())
            names.add(image.id)
        self.images = frozenset(names)
        return self.images

    def close(self) -> None:
        self.calls.shutdown(wait=False, cancel_futures=True)
        self.client.close()


def connect(setting: str, *, node_id: str, home: str,
            env: dict[str, str] | None = None) -> Engine | None:
    """The engine `setting` names (``auto``, ``off`` or a Docker host URL), or None (rule 1)."""
    if setting == "off":
        return None
    environ = os.environ if env is None else env
    url = setting if setting != "auto" else environ.get("DOCKER_HOST") or _DEFAULT_SOCKET
    if url.startswith("unix://") and not os.path.exists(url[len("unix://"):]):
        log.info("no container engine: %s does not exist; image specs are declined", url)
        return None
    import docker  # imported only where an engine may answer: the client costs memory

    try:
        client = docker.DockerClient(base_url=url, timeout=60, max_pool_size=64)
        version = str(client.version().get("Version", "?"))
    except Exception as exc:  # the SDK raises DockerException, requests' and OSError's
        log.warning("no container engine answers at %s (%s); image specs are declined",
                    url, exc)
        return None
    engine = Engine(client, node_id=node_id, home=home, version=version, url=url)
    try:
        engine.refresh_images()
    except Exception as exc:
        log.warning("cannot list the engine's images: %s", exc)
    log.info("container engine %s at %s, %d image names held", version, url,
             len(engine.images))
    return engine
