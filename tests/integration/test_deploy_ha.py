"""compose/compose.ha.yaml, checked without a Docker engine, as compose/compose.yaml is
(tests/integration/test_deploy.py): parsed, every gavel service's exact command line run
with --check in its environment and mounts, each nats-server's exact command line tested by
the nats-server from the wheel (``-t``).

What must hold: three nats-servers of one cluster, each named apart, each routed to all
three, each with a store of its own; three brokers with ``[ha]`` on, ids apart, every one
pushing to the git daemon's repository and reaching every server; the workers and the
gateway reaching every server too; the remote refusing non-fast-forward pushes.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gavel.transport.natsserver import find_binary
from tests.integration.test_deploy import COMPOSE, check, environment, keys, mounts

yaml = pytest.importorskip("yaml", reason="PyYAML is in the test extras")
pytestmark = pytest.mark.integration

SERVERS = ("nats-1", "nats-2", "nats-3")
BROKERS = ("broker-1", "broker-2", "broker-3")


def compose_ha() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((COMPOSE / "compose.ha.yaml").read_text())
    return data


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_three_nats_servers_make_one_cluster(tmp_path: Path) -> None:
    top = compose_ha()
    services = top["services"]
    names, stores = set(), set()
    auth = keys(tmp_path)
    for name in SERVERS:
        service = services[name]
        assert service["entrypoint"] == ["tini", "--", "nats-server"]
        mapping = mounts(service, top, auth)
        assert mapping["/etc/nats/auth/nats.conf"] == auth / "nats.conf"
        etc = tmp_path / name  # the conf with `gavel auth init`'s users beside it
        (etc / "auth").mkdir(parents=True)
        for container in ("nats.conf", "auth/nats.conf"):
            (etc / container).write_text(mapping[f"/etc/nats/{container}"].read_text())
        argv = [str(etc / "nats.conf") if a == "/etc/nats/nats.conf" else a
                for a in service["command"]]
        assert flag(argv, "--server_name") == name
        names.add(flag(argv, "--server_name"))
        assert flag(argv, "--cluster_name") == "gavel"
        assert flag(argv, "--cluster") == "nats://0.0.0.0:6222"
        assert set(flag(argv, "--routes").split(",")) == {f"nats://{s}:6222" for s in SERVERS}
        stores |= {v.split(":")[0] for v in service["volumes"] if not v.startswith(".")}
        env = {**os.environ, **environment(service)}
        proc = subprocess.run([find_binary(), *argv, "-t"], capture_output=True, text=True,
                              env=env, timeout=30)
        assert proc.returncode == 0, proc.stderr + proc.stdout
    assert len(names) == 3 and len(stores) == 3  # a name and a JetStream store each


def test_three_ha_brokers_share_the_remote_and_reach_every_server(tmp_path: Path) -> None:
    top = compose_ha()
    services = top["services"]
    ids = set()
    auth = keys(tmp_path)
    for name in BROKERS:
        service = services[name]
        cfg = check(service["command"], environment(service), mounts(service, top, auth),
                    tmp_path)
        assert cfg["broker_id"] == name
        ids.add(cfg["broker_id"])
        assert cfg["ha"]["replicas"] == 3
        assert cfg["ha"]["renew_s"] < cfg["ha"]["lease_ttl_s"] / 2
        assert cfg["push"] == "git://remote/state.git"
        assert cfg["nats"].split(",") == [f"nats://{s}:4222" for s in SERVERS]
        assert Path(cfg["creds"]) == auth / "broker.nk"  # `gavel auth init`'s, as `gavel up`
        assert {"remote", *SERVERS} <= set(service["depends_on"])
        named = {v.split(":")[1] for v in service["volumes"] if not v.startswith(".")}
        assert cfg["state"] in named
    assert len(ids) == 3


def test_workers_and_the_gateway_reach_every_server(tmp_path: Path) -> None:
    top = compose_ha()
    services = top["services"]
    others = [n for n, s in services.items()
              if s.get("command", [""])[0] in ("worker", "gateway")]
    assert len(others) == 4
    auth = keys(tmp_path)
    for name in others:
        service = services[name]
        cfg = check(service["command"], environment(service), mounts(service, top, auth),
                    tmp_path)
        assert cfg["nats"].split(",") == [f"nats://{s}:4222" for s in SERVERS], name
        own = "operator" if name == "gateway" else name
        assert Path(cfg["creds"]) == auth / f"{own}.nk", name


def test_the_remote_serves_one_bare_repository_refusing_non_fast_forwards() -> None:
    remote = compose_ha()["services"]["remote"]
    script = " ".join(remote["command"])
    assert "git init --quiet --bare --initial-branch=main /var/lib/gavel/state.git" in script
    assert "receive.denyNonFastForwards true" in script
    assert "--enable=receive-pack" in script and "--base-path=/var/lib/gavel" in script
    assert remote["volumes"] == ["remote:/var/lib/gavel"]
