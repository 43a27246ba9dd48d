"""The worker's log settings: a config key, a GAVEL_* variable and a flag each (file < env
< flags), sensible defaults, one sentence for a bad value, and the limits the agent gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from gavel.cli import main as cli
from gavel.cli.config import ConfigError, WorkerConfig, load
from gavel.cli.options import WORKER_OPTIONS, flags_of
from gavel.cli.workerdaemon import log_limits
from gavel.worker.logfiles import LogLimits


def worker(argv: list[str], file: str | None = None, env: dict[str, str] | None = None
           ) -> WorkerConfig:
    args = cli.build_parser().parse_args(["worker", "--node-id", "n", *argv])
    return load(WorkerConfig, WORKER_OPTIONS, file=file, env=env or {},
                flags=flags_of(args, WORKER_OPTIONS))


def test_defaults_are_ten_mb_three_files_a_day_and_a_hundred() -> None:
    cfg = worker([])
    assert (cfg.instance_log_mb, cfg.instance_log_files, cfg.ended_logs_s,
            cfg.ended_logs_max) == (10.0, 3, 86_400.0, 100)
    assert log_limits(cfg) == LogLimits(max_bytes=10 * 2**20, files=3, keep_s=86_400.0,
                                        keep_max=100) == LogLimits()


def test_file_then_env_then_flag(tmp_path: Path) -> None:
    file = tmp_path / "w.toml"
    file.write_text("instance_log_mb = 1.5\ninstance_log_files = 5\nended_logs_s = 60\n"
                    "ended_logs_max = 7\n")
    cfg = worker([], str(file))
    assert log_limits(cfg) == LogLimits(max_bytes=int(1.5 * 2**20), files=5, keep_s=60.0,
                                        keep_max=7)
    env = {"GAVEL_INSTANCE_LOG_MB": "2", "GAVEL_INSTANCE_LOG_FILES": "4",
           "GAVEL_ENDED_LOGS_S": "30", "GAVEL_ENDED_LOGS_MAX": "3"}
    cfg = worker([], str(file), env)
    assert (cfg.instance_log_mb, cfg.instance_log_files, cfg.ended_logs_s,
            cfg.ended_logs_max) == (2.0, 4, 30.0, 3)
    cfg = worker(["--instance-log-mb", "0.5", "--instance-log-files", "1", "--ended-logs-s",
                  "0", "--ended-logs-max", "0"], str(file), env)
    assert log_limits(cfg) == LogLimits(max_bytes=2**19, files=1, keep_s=0.0, keep_max=0)


@pytest.mark.parametrize(("body", "says"), [
    ("instance_log_mb = 0\n", "field `instance_log_mb` expected `float` > 0"),
    ("instance_log_files = 0\n", "field `instance_log_files` expected `int` >= 1"),
    ("ended_logs_s = -1\n", "field `ended_logs_s` expected `float` >= 0"),
    ("ended_logs_max = -1\n", "field `ended_logs_max` expected `int` >= 0"),
])
def test_a_bad_value_is_one_sentence(tmp_path: Path, body: str, says: str) -> None:
    file = tmp_path / "w.toml"
    file.write_text(body)
    with pytest.raises(ConfigError, match=says):
        worker([], str(file))
