"""compose/healthcheck.py, the gavel image's health check: which port it asks for each role
(the compose tests run it for real in every container)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def healthcheck() -> ModuleType:
    path = ROOT / "compose" / "healthcheck.py"
    spec = importlib.util.spec_from_file_location("healthcheck", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_metrics_port_comes_from_the_roles_own_settings_in_their_order(
        tmp_path: Path) -> None:
    port = healthcheck().metrics_port
    conf = tmp_path / "worker.toml"
    conf.write_text('metrics_port = 9101\nlog_format = "json"\n')
    argv = ["worker", "--config", str(conf), "--node-id", "w"]
    assert port(argv, {}) == 9101
    assert port(argv, {"GAVEL_METRICS_PORT": "9200"}) == 9200
    assert port([*argv, "--metrics-port", "9300"], {"GAVEL_METRICS_PORT": "9200"}) == 9300
    assert port([*argv, "--metrics-port=9301"], {}) == 9301
    assert port(["worker"], {"GAVEL_CONFIG": str(conf)}) == 9101
    conf.write_text('log_format = "json"\n')
    assert port(argv, {}) is None  # nothing to ask: healthy while it runs
    assert port(["broker"], {}) is None
