"""The broker's HA settings: the `[ha]` table, `--ha` and the lease flags, a broker id."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gavel.cli import main as cli
from gavel.cli.config import (
    BrokerConfig,
    ConfigError,
    HaConfig,
    default_broker_id,
    load,
    render,
)
from gavel.cli.options import BROKER_OPTIONS, flags_of


def broker(argv: list[str], file: str | None = None, env: dict[str, str] | None = None
           ) -> BrokerConfig:
    args = cli.build_parser().parse_args(["broker", *argv])
    return load(BrokerConfig, BROKER_OPTIONS, file=file, env=env or {},
                flags=flags_of(args, BROKER_OPTIONS))


def test_without_ha_settings_the_broker_is_alone_as_ever() -> None:
    cfg = broker(["--state", "s"])
    assert cfg.ha is None and cfg.broker_id == default_broker_id()
    assert "[ha]" not in render(cfg)


def test_the_ha_switch_takes_the_defaults_and_needs_the_shared_remote() -> None:
    cfg = broker(["--state", "s", "--ha", "--push", "/srv/state.git", "--broker-id", "b-1"])
    assert cfg.ha == HaConfig() and cfg.broker_id == "b-1"
    assert (cfg.ha.lease_ttl_s, cfg.ha.renew_s, cfg.ha.replicas) == (10.0, 2.0, 3)
    with pytest.raises(ConfigError, match="field `ha` needs `push`"):
        broker(["--state", "s", "--ha"])


def test_the_table_flags_and_environment_layer_field_by_field(tmp_path: Path) -> None:
    file = tmp_path / "b.toml"
    file.write_text('state = "s"\npush = "/r.git"\n[ha]\nlease_ttl_s = 6.0\nreplicas = 1\n')
    cfg = broker(["--lease-renew-s", "1.5"], file=str(file),
                 env={"GAVEL_LEASE_TTL_S": "8", "GAVEL_BROKER_ID": "env-b"})
    assert cfg.ha == HaConfig(lease_ttl_s=8.0, renew_s=1.5, replicas=1)
    assert cfg.broker_id == "env-b"
    back = tomllib.loads(render(cfg))  # renders back as the table it came from
    assert back["ha"] == {"lease_ttl_s": 8.0, "renew_s": 1.5, "replicas": 1}
    assert broker([], file=str(file), env={"GAVEL_HA": "0"}).ha is None  # switched off


def test_bad_ha_settings_are_one_sentence_each(tmp_path: Path) -> None:
    base = ["--state", "s", "--push", "/r.git"]
    with pytest.raises(ConfigError, match=r"`ha\.renew_s` must be under half"):
        broker([*base, "--lease-ttl-s", "4", "--lease-renew-s", "2"])
    with pytest.raises(ConfigError, match="must be a branch"):
        broker([*base, "--ha", "--ref", "refs/tags/v1"])
    with pytest.raises(ConfigError, match="GAVEL_HA"):
        broker(base, env={"GAVEL_HA": "maybe"})
    file = tmp_path / "b.toml"
    file.write_text('state = "s"\npush = "/r.git"\n[ha]\nreplicas = 7\n')
    with pytest.raises(ConfigError, match="replicas"):
        broker([], file=str(file))
    file.write_text('state = "s"\npush = "/r.git"\n[ha]\nleader = "me"\n')
    with pytest.raises(ConfigError, match="unknown field `leader`"):
        broker([], file=str(file))
    with pytest.raises(SystemExit):  # argparse: exit 2 naming the flag
        broker(["--state", "s", "--broker-id", "no spaces"])
