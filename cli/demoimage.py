"""The demo's container workload (`gavel up --demo`): an image built here, never pulled.

Rule: where a Docker Engine answers and the host has a static busybox, the demo builds
``gavel-demo-busybox:1`` (FROM scratch, busybox as its ENTRYPOINT: a few hundred
milliseconds, once) and places one job from it; anywhere else it says in one line why not and
how to get one, and the rest of the demo runs as without it.
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from gavel.shared.spec import Spec
from gavel.shared.timing import Timing

__all__ = ["IMAGE", "container_spec"]

IMAGE = "gavel-demo-busybox:1"
_BUSYBOX = Path("/bin/busybox")
_DOCKERFILE = b'FROM scratch\nCOPY busybox /bin/busybox\nENTRYPOINT ["/bin/busybox"]\n'
_HOW = ("start a Docker Engine (Debian: apt-get install docker.io busybox-static; dockerd) "
        "and the demo places a container too (docs/containers.md)")


def container_spec() -> tuple[Spec | None, str]:
    """The container job, or None and the one line that says why there is none (blocking)."""
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if host.startswith("unix://") and not Path(host[len("unix://"):]).exists():
        return None, f"no container engine here: {_HOW}"
    try:
        import docker

        client = docker.DockerClient(base_url=host, timeout=Timing().engine_call_s)
        client.ping()
    except Exception as exc:
        return None, f"no container engine answers at {host} ({type(exc).__name__}): {_HOW}"
    try:
        try:
            client.images.get(IMAGE)
        except docker.errors.ImageNotFound:
            head = _BUSYBOX.read_bytes()[:65536] if _BUSYBOX.is_file() else b""
            if not head.startswith(b"\x7fELF") or b"ld-linux" in head:
                return None, ("a container engine answers, but there is no static "
                              f"{_BUSYBOX} to build the demo's image from: apt-get install "
                              "busybox-static")
            client.images.build(fileobj=_context(), custom_context=True, tag=IMAGE, rm=True)
    except Exception as exc:
        return None, f"the demo's image could not be built: {exc}"
    finally:
        client.close()
    return Spec(name="hello-container", image=IMAGE,
                command=["echo", "hello from a container"], cpu=0.5, memory_mb=64), ""


def _context() -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(_DOCKERFILE)
        tar.addfile(info, io.BytesIO(_DOCKERFILE))
        tar.add(str(_BUSYBOX), arcname="busybox")
    buf.seek(0)
    return buf
