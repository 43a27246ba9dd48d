"""The deployment files, checked without a Docker engine or systemd.

compose/compose.yaml is parsed, and every service's exact command line is run against the
installed `gavel` (or nats-server) in check mode, with the service's environment and its bind
mounts mapped to the files in compose/ and to the keys `gavel auth init` writes (compose/setup
runs it), so a renamed flag, a config key that no longer exists or a broken nats.conf fails
here. The NATS config is also run for real: the broker and a worker place an instance through
their nkey identities' permissions, and a worker cannot speak as another node; so is the Caddy
config, by the Caddy from the wheel. deploy/gavel-worker.service's ExecStart is checked the same
way. Bringing the compose files up on an engine is test_compose.py's.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import nats
import pytest

from gavel.broker.service import Broker, Config
from gavel.shared import subjects
from gavel.shared.nodebook import KnownNode
from gavel.shared.strategies import make_strategy
from gavel.transport import identity, nodebook
from gavel.transport.creds import connect_options
from gavel.transport.natsserver import find_binary, free_port
from gavel.worker.agent import Agent
from tests.integration.harness import TIMING, sleeper_spec, wait_for

yaml = pytest.importorskip("yaml", reason="PyYAML is in the test extras")
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
GAVEL = [sys.executable, "-m", "gavel"]


def dotenv(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


ENV = dotenv(COMPOSE / ".env.example")
#: The identities compose/setup makes (`gavel auth init --node-ids ...`).
NODES = ("worker-1", "worker-2", "worker-3")
#: Whose seed each gavel service mounts at /etc/gavel/nats.nk.
IDENTITY = {"broker": "broker", "gateway": "operator", **{n: n for n in NODES}}


def keys(tmp: Path) -> Path:
    """What compose/setup writes into compose/auth, written into `tmp`/auth: the identities
    and the node book (each worker at its service name and worker.toml's port range)."""
    directory = identity.init(tmp, NODES).directory
    nodebook.record(directory, {n: KnownNode(address=n, ports=(20000, 20999)) for n in NODES})
    return directory


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ${VAR}, ${VAR:-default} and ${VAR:?error}."""
    def sub(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2) or "", m.group(3) or ""
        value = env.get(name, "")
        if op == ":?" and not value:
            raise AssertionError(f"{name} is required: {arg}")
        return value if value or op != ":-" else arg
    return re.sub(r"\$\{([A-Z0-9_]+)(?:(:-|:\?)([^}]*))?\}", sub, text)


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((COMPOSE / "compose.yaml").read_text())
    return data


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {k: interpolate(str(v), ENV) for k, v in env.items()}


def mounts(service: dict[str, Any], top: dict[str, Any], auth: Path) -> dict[str, Path]:
    """Container path -> host file, for bind mounts and compose secrets; ./auth/ is `auth`
    (`keys`)."""
    out: dict[str, Path] = {}
    for vol in service.get("volumes", []):
        src, _, rest = vol.partition(":")
        if src.startswith("./auth/"):
            out[rest.split(":")[0]] = auth / src.removeprefix("./auth/")
        elif src.startswith("."):
            out[rest.split(":")[0]] = (COMPOSE / src).resolve()
    for s in service.get("secrets", []):
        name = s["source"] if isinstance(s, dict) else s
        target = s.get("target", f"/run/secrets/{name}") if isinstance(s, dict) \
            else f"/run/secrets/{name}"
        out[target] = (COMPOSE / interpolate(top["secrets"][name]["file"], ENV)).resolve()
    return out


def rewrite(path: Path, mapping: dict[str, Path], tmp: Path) -> Path:
    """A copy of a TOML config whose container paths point at the mapped host files."""
    text = path.read_text()
    for container, host in mapping.items():
        text = text.replace(f'"{container}"', json.dumps(str(host)))
    out = tmp / path.name
    out.write_text(text)
    return out


def check(argv: list[str], env: dict[str, str], mapping: dict[str, Path], tmp: Path
          ) -> dict[str, str]:
    """Run the daemon's exact command line with --check; the effective config, parsed."""
    args = []
    for a in argv:
        if a in mapping:
            a = str(rewrite(mapping[a], mapping, tmp) if a.endswith(".toml") else mapping[a])
        args.append(a)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GAVEL_")}
    proc = subprocess.run([*GAVEL, *args, "--check"], capture_output=True, text=True,
                          env={**clean, **env}, timeout=60)
    assert proc.returncode == 0, f"{shlex.join(argv)}: {proc.stderr}"
    import tomllib
    return tomllib.loads(proc.stdout)


def test_dockerfile_builds_the_gavel_image() -> None:
    """The image compose/build-image builds: `gavel` behind tini, as a user of its own, with a
    health check and its version labelled; its context is the wheelhouse and the files of
    compose/ that build-image copies, and every service of both compose files runs it (none
    builds, none pulls)."""
    text = (COMPOSE / "Dockerfile").read_text()
    assert re.search(r'^ENTRYPOINT \["tini", "--", "gavel"\]$', text, re.M)
    assert re.search(r"^USER gavel$", text, re.M) and re.search(r"^HEALTHCHECK ", text, re.M)
    assert 'org.opencontainers.image.version="${VERSION}"' in text
    script = (COMPOSE / "build-image").read_text()
    for m in re.finditer(r"^COPY (?!--from)(.+)$", text, re.M):
        *sources, _dest = m.group(1).split()
        for src in sources:
            assert src == "wheelhouse" or f'"$root/compose/{src}"' in script, \
                f"COPY {src}: build-image does not put it in the context"
    for name in ("compose.yaml", "compose.ha.yaml"):
        top = yaml.safe_load((COMPOSE / name).read_text())
        for service, spec in top["services"].items():
            assert spec["image"] == "${GAVEL_IMAGE:-gavel:local}", (name, service)
            assert "build" not in spec, (name, service)


#: Services that run another program of the image than gavel: checked by their own tests.
OTHER_IMAGES = ("nats", "caddy")


def published(service: dict[str, Any]) -> set[str]:
    """The container ports a service publishes."""
    return {p.rsplit(":", 1)[1] for p in service.get("ports", [])}


def test_every_compose_service_runs_its_command(tmp_path: Path) -> None:
    top = compose()
    auth = keys(tmp_path)
    services = top["services"]
    assert {"nats", "broker", "caddy", "gateway"} <= set(services)
    workers = {name: s for name, s in services.items() if s["command"][0] == "worker"}
    strategies, node_ids = set(), set()
    for name, service in services.items():
        if name in OTHER_IMAGES:
            continue
        assert "entrypoint" not in service  # the image's: gavel
        mapping = mounts(service, top, auth)
        cfg = check(service["command"], environment(service), mapping, tmp_path)
        if service["command"][0] != "gateway":  # the gateway keeps no state (it re-derives)
            # The state lives on the service's named volume.
            named = {v.split(":")[1] for v in service["volumes"] if not v.startswith(".")}
            assert cfg["state"] in named
        assert cfg["log_format"] == "json" and cfg["metrics_addr"] == "0.0.0.0"
        assert str(cfg["metrics_port"]) in published(service)
        # Its own identity, an nkey seed from `gavel auth init`; no password anywhere.
        assert Path(cfg["creds"]) == auth / f"{IDENTITY[name]}.nk"
        assert cfg["nats"] == "nats://nats:4222"
        if name in workers:
            strategies.add(cfg["strategy"])
            node_ids.add(cfg["node_id"])
            assert cfg["node_id"] == name
            assert cfg["advertise"] == name  # the name the caddy service dials
    assert len(workers) == 3 and len(strategies) == 3 and len(node_ids) == 3


def test_the_gateway_service_reaches_the_caddy_service(tmp_path: Path) -> None:
    """The gateway names the caddy service's admin API, as the operator user, and the port
    of the server it creates is the one the caddy service publishes."""
    top = compose()
    gateway, caddy = top["services"]["gateway"], top["services"]["caddy"]
    cfg = check(gateway["command"], environment(gateway), mounts(gateway, top, keys(tmp_path)),
                tmp_path)
    assert cfg["admin"] == "http://caddy:2019" and cfg["server"] == "gavel"
    assert {a.rsplit(":", 1)[1] for a in cfg["listen"]} <= published(caddy)
    assert Path(cfg["creds"]).name == "operator.nk"
    assert {"nats", "caddy"} <= set(gateway["depends_on"])
    admin = json.loads((COMPOSE / "caddy.json").read_text())["admin"]
    assert admin["listen"] == "0.0.0.0:2019" and "2019" not in published(caddy)
    assert "caddy:2019" in admin["origins"]


async def test_caddy_service_config_runs_and_admits_only_the_gateway(tmp_path: Path) -> None:
    """compose/caddy.json, run by the real Caddy (its port moved to a free one on loopback):
    the admin API answers a request that names the caddy service as its host, as the
    gateway's do, and refuses any other host."""
    from gavel.gateway.caddyserver import find_binary as caddy_binary

    service = compose()["services"]["caddy"]
    assert service["entrypoint"] == ["tini", "--"]
    mapping = mounts(service, compose(), keys(tmp_path))
    argv = [str(mapping.get(a, a)) for a in service["command"]]
    assert argv[:2] == ["caddy", "run"]
    port = free_port()
    conf = tmp_path / "caddy.json"
    conf.write_text(Path(argv[argv.index("--config") + 1]).read_text()
                    .replace("0.0.0.0:2019", f"127.0.0.1:{port}")
                    .replace("caddy:2019", f"caddy:{port}"))
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"),
           "XDG_CONFIG_HOME": str(tmp_path / "config")}
    proc = subprocess.Popen([caddy_binary(), "run", "--config", str(conf)], env=env,
                            stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "caddy.log", "wb"))  # noqa: SIM115

    def status(host: str) -> int:
        import urllib.error
        import urllib.request
        req = urllib.request.Request(f"http://127.0.0.1:{port}/config/",
                                     headers={"Host": host})
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    def answering() -> bool:
        assert proc.poll() is None, (tmp_path / "caddy.log").read_text()
        try:
            return status(f"caddy:{port}") == 200
        except OSError:
            return False
    try:
        await wait_for(answering, 15, what="caddy with the compose config")
        assert status(f"elsewhere:{port}") == 403
    finally:
        proc.terminate()
        proc.wait(10)


def nats_files(service: dict[str, Any], auth: Path, tmp: Path,
               store: Path | None = None) -> list[str]:
    """The nats service's command line with its /etc/nats mounts laid out under `tmp` as the
    container sees them (nats.conf includes auth/nats.conf beside it); its JetStream store
    moved to `store` when given."""
    mapping = mounts(service, compose(), auth)
    etc = tmp / "etc-nats"
    for container, host in mapping.items():
        if container.startswith("/etc/nats/"):
            target = etc / container.removeprefix("/etc/nats/")
            target.parent.mkdir(parents=True, exist_ok=True)
            text = host.read_text()
            if store is not None:
                text = text.replace('store_dir: "/var/lib/gavel/jetstream"',
                                    f"store_dir: {json.dumps(str(store))}")
            target.write_text(text)
    return [str(etc / a.removeprefix("/etc/nats/")) if a.startswith("/etc/nats/") else a
            for a in service["command"]]


def test_nats_service_config_is_valid(tmp_path: Path) -> None:
    service = compose()["services"]["nats"]
    assert service["entrypoint"] == ["tini", "--", "nats-server"]
    argv = nats_files(service, keys(tmp_path), tmp_path)
    conf = Path(argv[argv.index("--config") + 1])
    text = conf.read_text()
    assert "jetstream" in text and 'include "auth/nats.conf"' in text
    assert "authorization" in (conf.parent / "auth" / "nats.conf").read_text()
    proc = subprocess.run([find_binary(), *argv, "-t"], capture_output=True,
                          text=True, env=dict(os.environ), timeout=30)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    (conf.parent / "auth" / "nats.conf").unlink()
    proc = subprocess.run([find_binary(), *argv, "-t"], capture_output=True,
                          text=True, env=dict(os.environ), timeout=30)
    assert proc.returncode != 0  # without `gavel auth init`'s users: an error, never "no auth"


async def test_nats_permissions_carry_a_placement_and_stop_impersonation(
        tmp_path: Path) -> None:
    auth = keys(tmp_path)
    argv = nats_files(compose()["services"]["nats"], auth, tmp_path, store=tmp_path / "js")
    conf = argv[argv.index("--config") + 1]
    port = free_port()
    # -m: the compose file's fixed monitor port (8222, the container's own) may be taken by
    # another test's server on this host; the flag overrides the file.
    server = subprocess.Popen([find_binary(), "-c", conf, "-a", "127.0.0.1", "-p",
                               str(port), "-m", str(free_port())], stdout=subprocess.DEVNULL,
                              stderr=open(tmp_path / "nats.log", "wb"))  # noqa: SIM115

    def listening() -> bool:
        assert server.poll() is None, (tmp_path / "nats.log").read_text()
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            return False
    await wait_for(listening, 10, what="nats-server with the compose config")

    url = f"nats://127.0.0.1:{port}"

    def seed(who: str) -> dict[str, Any]:
        return connect_options(str(auth / f"{who}.nk"))

    broker = Broker(Config(nats_url=url, state_dir=tmp_path / "state", timing=TIMING,
                           nats_options=seed("broker")))
    agent = Agent(nats_url=url, node_id="worker-1",
                  strategy=make_strategy("least-loaded"), labels={},
                  state_dir=tmp_path / "w1", timing=TIMING, cpu=2.0, memory_mb=2048,
                  nats_options=seed("worker-1"))
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    spy = None
    task = None
    try:
        await broker.start()
        task = asyncio.create_task(agent.run())
        await wait_for(lambda: len(broker.liveness.eligible(broker.now())) == 1, 15,
                       what="worker-1 to heartbeat through its permissions")
        from gavel.shared.api import SubmitReply, SubmitRequest
        from gavel.transport.client import call
        op = await nats.connect(url, **seed("operator"))
        try:
            reply = await call(op, "submit", SubmitRequest(spec=sleeper_spec("s", cpu=0.5)),
                               SubmitReply)
        finally:
            await op.close()
        iid = reply.instance_id

        def placed() -> bool:
            nf = broker.ledger.state().nodes.get("worker-1")
            return nf is not None and iid in nf.instances
        await wait_for(placed, 15, what="the placement")
        await wait_for(lambda: any(r.instance_id == iid and r.state == "running"
                                   for r in agent.instances()), 15,
                       what="worker-1 to run its award")
        spy = await nats.connect(url, error_cb=on_error, **seed("worker-1"))
        await spy.publish(subjects.HEARTBEAT.format(node="worker-2"), b"x")
        await spy.flush()
        await wait_for(lambda: any("permissions violation" in e.lower() for e in errors), 10,
                       what="the server to refuse worker-1 speaking as worker-2")
    finally:
        if spy is not None:
            await spy.close()
        await agent.stop()
        if task is not None:
            await task
        await broker.close()
        server.terminate()
        server.wait(10)


def test_systemd_unit_execstart_runs(tmp_path: Path) -> None:
    unit = (ROOT / "deploy" / "gavel-worker.service").read_text()
    lines = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert len(lines) == 1
    argv = shlex.split(lines[0].removeprefix("ExecStart="))
    assert argv[0].endswith("/gavel")
    env = dotenv(ROOT / "deploy" / "worker.env.example")
    mapping = {"/etc/gavel/worker.toml": ROOT / "deploy" / "worker.toml"}
    cfg = check(argv[1:], env, mapping, tmp_path)
    assert cfg["node_id"] and cfg["metrics_port"] == 9101 and cfg["log_format"] == "json"
    assert cfg["state"] == "/var/lib/gavel-worker"
    assert "***" in cfg["nats"]
