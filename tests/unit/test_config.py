"""Config files: file < environment < flags, unknown fields refused, one sentence per mistake."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from gavel.cli import main as cli
from gavel.cli.config import (
    NO_NODE_BOOK,
    BrokerConfig,
    ConfigError,
    GatewayConfig,
    WorkerConfig,
    effective_timing,
    load,
    render,
)
from gavel.cli.options import BROKER_OPTIONS, GATEWAY_OPTIONS, WORKER_OPTIONS, flags_of
from gavel.shared.nodebook import entry
from gavel.shared.redact import mask_url
from gavel.shared.timing import Timing
from gavel.shared.tuning import LADDER
from gavel.transport import nodebook


def write(tmp_path: Path, text: str, name: str = "gavel.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def worker(argv: list[str], file: str | None = None, env: dict[str, str] | None = None
           ) -> WorkerConfig:
    args = cli.build_parser().parse_args(["worker", *argv])
    return load(WorkerConfig, WORKER_OPTIONS, file=file, env=env or {},
                flags=flags_of(args, WORKER_OPTIONS))


def test_file_then_env_then_flags(tmp_path: Path) -> None:
    file = write(tmp_path, 'node_id = "from-file"\nstrategy = "binpack"\ncpu = 2.0\n'
                 'labels = { zone = "a" }\nmetrics_port = 9100\n')
    cfg = worker([], file)
    assert (cfg.node_id, cfg.strategy, cfg.cpu, cfg.labels) == ("from-file", "binpack", 2.0,
                                                               {"zone": "a"})
    env = {"GAVEL_NODE_ID": "from-env", "GAVEL_CPU": "3", "GAVEL_LABELS": "zone=b,gpu=1"}
    cfg = worker([], file, env)
    assert (cfg.node_id, cfg.strategy, cfg.cpu, cfg.labels) == (
        "from-env", "binpack", 3.0, {"zone": "b", "gpu": "1"})
    cfg = worker(["--node-id", "from-flag", "--labels", "zone=c"], file, env)
    assert (cfg.node_id, cfg.cpu, cfg.labels, cfg.metrics_port) == (
        "from-flag", 3.0, {"zone": "c"}, 9100)


def test_absent_flags_do_not_hide_lower_layers(tmp_path: Path) -> None:
    file = write(tmp_path, 'node_id = "n1"\nports = [30000, 30099]\nlog_format = "json"\n')
    cfg = worker([], file)
    assert cfg.ports == (30000, 30099) and cfg.log_format == "json"
    assert cfg.state == ".gavel-worker-n1"


def test_repeatable_flag_and_comma_list_env(tmp_path: Path) -> None:
    cfg = worker(["--node-id", "n", "--strategy", "headroom", "--strategy-param", "ceiling=0.5",
                  "--strategy-param", "x=2"])
    assert cfg.strategy_params == {"ceiling": 0.5, "x": 2.0}
    cfg = worker([], env={"GAVEL_NODE_ID": "n", "GAVEL_STRATEGY_PARAMS": "ceiling=0.6"})
    assert cfg.strategy_params == {"ceiling": 0.6}


@pytest.mark.parametrize(("text", "expected"), [
    ('node_id = "n"\nmetrics_prt = 1\n', "unknown field `metrics_prt`; expected one of"),
    ('node_id = "n"\nmetrics_port = "x"\n', "field `metrics_port` expected `int`, got `str`."),
    ('node_id = "n"\nports = [1, 70000]\n', "field `ports[1]` expected `int` <= 65535."),
    ('node_id = "n"\nlog_format = "xml"\n', "field `log_format`"),
    ('node_id = "n n"\n', "field `node_id` expected `str` matching regex"),
    ('node_id = "n"\nstrategy = "cheapest"\n', "field `strategy` expected one of binpack"),
    ('node_id = "n"\nports = [2000, 1000]\n', "field `ports` expected FIRST <= LAST"),
    ('node_id = "n"\n[timing]\nheartbeat = 1.0\n', "unknown field `heartbeat` in table "
     "`timing`."),
    ("cpu = 2.0\n", "field `node_id` is required"),
    ('node_id = "n"\n[timing]\ntick_s = -1.0\n', "field `timing.tick_s` expected `float` > 0.0"),
    ('node_id = "n"\n[timing]\nheartbeat_s = nan\n', "expected `float` > 0.0"),
    ('node_id = "n"\n[timing]\noffline_s = inf\n', "config file"),
    ('node_id = "n"\n[timing]\noffline_s = inf\n', "field `timing.offline_s` expected a "
     "finite number of seconds above 0, got inf."),
    ('node_id = "n"\n[timing]\nretention_s = -5.0\n', "`timing.retention_s` expected `float` "
     ">= 0.0"),
    ('node_id = "n"\n[timing]\nunreachable_s = 5.0\n', "fields `timing.heartbeat_s` < "
     "`timing.unreachable_s` <= `timing.offline_s` expected"),
    ('node_id = "n"\n[timing]\noffline_s = 20.0\n', "got 10.0, 30.0, 20.0."),
    ("node_id = \n", "is not valid TOML"),
])
def test_bad_worker_file_names_the_field(tmp_path: Path, text: str, expected: str) -> None:
    file = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        worker([], file)
    message = str(err.value)
    assert expected in message
    assert "\n" not in message and message.endswith(".")


def test_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="environment variable GAVEL_METRICS_PORT: 'abc' is "
                       "not a whole number"):
        worker(["--node-id", "n"], env={"GAVEL_METRICS_PORT": "abc"})


def test_isolation_settings_come_from_file_env_and_flags(tmp_path: Path) -> None:
    cfg = worker(["--node-id", "n"], env={})
    assert (cfg.isolation, cfg.uids, cfg.allow_root) == ("uids", (200_000, 265_535), False)
    file = write(tmp_path, 'node_id = "n"\nuids = [5000, 5999]\nallow_root = true\n')
    assert (worker([], file).uids, worker([], file).allow_root) == ((5000, 5999), True)
    assert worker([], file, {"GAVEL_UIDS": "7000-7099"}).uids == (7000, 7099)
    assert worker(["--uids", "8000-8000", "--allow-root", "no"], file).uids == (8000, 8000)
    assert not worker(["--allow-root", "no"], file).allow_root
    assert worker(["--isolation", "off"], file).isolation == "off"
    for bad in ("0-10", "10-5", "ten-20", "5"):  # root never, and a range that ends after it starts
        with pytest.raises(SystemExit):
            worker(["--node-id", "n", "--uids", bad])
    with pytest.raises(ConfigError, match="environment variable GAVEL_UIDS: uid range '9-1'"):
        worker(["--node-id", "n"], env={"GAVEL_UIDS": "9-1"})
    with pytest.raises(ConfigError, match=r"field `uids` expected FIRST <= LAST, got 9-1"):
        worker([], write(tmp_path, 'node_id = "n"\nuids = [9, 1]\n', "bad.toml"))
    with pytest.raises(ConfigError, match=r"field `uids\[0\]` expected `int` >= 1"):
        worker([], write(tmp_path, 'node_id = "n"\nuids = [0, 1]\n', "root.toml"))


def test_cgroups_settings_come_from_file_env_and_flags(tmp_path: Path) -> None:
    cfg = worker(["--node-id", "n"])
    assert (cfg.cgroups, cfg.cgroup_cpu) == ("auto", "weight")  # enforce what the host has
    file = write(tmp_path, 'node_id = "n"\ncgroups = "v1"\ncgroup_cpu = "quota"\n')
    assert (worker([], file).cgroups, worker([], file).cgroup_cpu) == ("v1", "quota")
    assert worker([], file, {"GAVEL_CGROUPS": "off"}).cgroups == "off"
    assert worker(["--cgroups", "v2"], file, {"GAVEL_CGROUPS": "off"}).cgroups == "v2"
    with pytest.raises(ConfigError, match=r"config file .*: field `cgroups` invalid enum "
                       r"value 'v3'"):
        worker([], write(tmp_path, 'node_id = "n"\ncgroups = "v3"\n', "bad.toml"))
    with pytest.raises(ConfigError, match="environment variable GAVEL_CGROUP_CPU: "):
        worker(["--node-id", "n"], env={"GAVEL_CGROUP_CPU": "hard"})


def test_broker_requires_state(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="field `state` is required"):
        load(BrokerConfig, BROKER_OPTIONS, file=None, env={})
    cfg = load(BrokerConfig, BROKER_OPTIONS, file=None, env={"GAVEL_STATE": "/s",
                                                             "GAVEL_PUSH": "file:///r.git"})
    assert (cfg.state, cfg.push, cfg.metrics_addr) == ("/s", "file:///r.git", "127.0.0.1")


def test_render_reads_back_and_masks_passwords(tmp_path: Path) -> None:
    file = write(tmp_path, 'state = "/var/lib/gavel"\nnats = "nats://broker:pw@nats:4222"\n'
                 'metrics_port = 9100\n[timing]\nheartbeat_s = 5.0\n')
    cfg = load(BrokerConfig, BROKER_OPTIONS, file=file, env={})
    text = render(cfg)
    assert "pw" not in text and "nats://broker:***@nats:4222" in text
    again = load(BrokerConfig, BROKER_OPTIONS, file=write(tmp_path, text, "again.toml"),
                 env={})
    assert again.timing == cfg.timing and again.metrics_port == 9100
    wcfg = worker(["--node-id", "n", "--labels", "a=1,b c=2"])
    assert tomllib.loads(render(wcfg))["labels"] == {"a": "1", "b c": "2"}


def test_mask_url() -> None:
    assert mask_url("nats://u:secret@h:4222") == "nats://u:***@h:4222"
    assert mask_url("nats://h:4222") == "nats://h:4222"
    assert mask_url("https://oauth2:tok@gitlab.example/x.git") == \
        "https://oauth2:***@gitlab.example/x.git"


def test_mask_url_masks_each_server_of_a_cluster_list() -> None:
    urls = "nats://b:pw1@nats-1:4222,nats://b:pw2@nats-2:4222,nats://nats-3:4222"
    assert mask_url(urls) == \
        "nats://b:***@nats-1:4222,nats://b:***@nats-2:4222,nats://nats-3:4222"
    assert mask_url("nats://b:pw@h:port") == "nats://b:***@h:port"  # no number: still masked


def test_retention_zero_is_allowed_and_stays_zero_under_fast_timers(tmp_path: Path) -> None:
    file = write(tmp_path, 'state = "s"\n[timing]\nretention_s = 0.0\n')
    cfg = load(BrokerConfig, BROKER_OPTIONS, file=file, env={})
    assert effective_timing(cfg, {"GAVEL_FAST_TIMERS": "1"}).retention_s == 0.0


def test_timing_table_and_fast_timers(tmp_path: Path) -> None:
    file = write(tmp_path, 'state = "s"\n[timing]\nheartbeat_s = 4.0\n')
    cfg = load(BrokerConfig, BROKER_OPTIONS, file=file, env={})
    assert effective_timing(cfg, {}).heartbeat_s == 4.0
    assert effective_timing(cfg, {"GAVEL_FAST_TIMERS": "1"}).heartbeat_s == pytest.approx(0.4)
    plain = load(BrokerConfig, BROKER_OPTIONS, file=None, env={"GAVEL_STATE": "s"})
    assert effective_timing(plain, {}) == Timing()


def test_every_flag_has_help() -> None:
    parser = cli.build_parser()
    missing = []

    def walk(p: object, path: str) -> None:
        for action in getattr(p, "_actions", []):
            choices = getattr(action, "choices", None)
            if isinstance(choices, dict):  # subcommands
                for name, sub in choices.items():
                    walk(sub, f"{path} {name}")
            elif action.option_strings and not action.help:
                missing.append(f"{path} {action.option_strings[0]}")
    walk(parser, "gavel")
    assert missing == []


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, 'node_id = "w1"\nstrategy = "spread"\n', "w.toml")
    assert cli.main(["config", "check", good]) == 0
    out = capsys.readouterr().out
    assert 'node_id = "w1"' in out and 'strategy = "spread"' in out
    bad = write(tmp_path, 'state = "s"\nmetrics_port = 0\n', "b.toml")
    assert cli.main(["config", "check", bad]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field `metrics_port` expected `int` >= 1" in err
    assert cli.main(["broker", "--config", good, "--check"]) == 2  # a worker file
    assert "unknown field `node_id`" in capsys.readouterr().err
    assert cli.main(["worker", "--config", good, "--check", "--node-id", "w2"]) == 0
    assert 'node_id = "w2"' in capsys.readouterr().out


def test_tls_cert_and_key_go_together() -> None:
    with pytest.raises(ConfigError, match="`tls_cert` and `tls_key` go together"):
        worker(["--node-id", "n", "--tls-cert", "c.pem"])
    cfg = worker(["--node-id", "n", "--tls-ca", "ca.pem"],
                 env={"GAVEL_TLS_CERT": "c.pem", "GAVEL_TLS_KEY": "k.pem"})
    assert (cfg.tls_ca, cfg.tls_cert, cfg.tls_key) == ("ca.pem", "c.pem", "k.pem")


@pytest.mark.parametrize(("argv", "words"), [
    (["bench", "--idle-s", "-1"], "argument --idle-s: '-1' must be 0 or more"),
    (["bench", "--rate", "nan"], "argument --rate: 'nan' must be greater than 0"),
    (["bench", "--rate", "inf"], "argument --rate: 'inf' must be a finite number"),
    (["bench", "--agents", "0"], "argument --agents: '0' must be greater than 0"),
    (["bench", "--commit-gap-ms", "-2"], "argument --commit-gap-ms: '-2' must be 0 or more"),
    (["broker", "--commit-gap-ms", "soon"], "argument --commit-gap-ms: 'soon' is not a number"),
    (["sim", "--bench", "--nodes", "0"], "argument --nodes: '0' must be greater than 0"),
    (["sim", "--bench", "--placements", "-3"], "argument --placements: '-3' must be greater"),
])
def test_bad_numbers_on_the_command_line_exit_2_with_a_sentence(
        argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert words in capsys.readouterr().err


def test_a_fractional_rate_is_a_rate() -> None:
    import argparse

    from gavel.cli.bench import add_arguments
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args(["--rate", "2.5", "--idle-s", "0"]).rate == 2.5


def test_auction_settings_reach_the_broker(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from gavel.cli.daemons import make_broker

    monkeypatch.chdir(tmp_path)  # `state = "s"` is relative: keep its repo out of the tree

    file = write(tmp_path, 'state = "s"\nsample_d = 3\nbatch_wait_ms = 5.0\nended_max = 7\n'
                 'commit_gap_ms = 25\n')
    cfg = load(BrokerConfig, BROKER_OPTIONS, file=file, env={"GAVEL_BATCH_MAX": "64"},
               flags=flags_of(cli.build_parser().parse_args(
                   ["broker", "--max-auctions", "4"]), BROKER_OPTIONS))
    b = make_broker(cfg, {})
    try:
        a = b.auctioneer
        assert (a.core.sample_d, a.batch_max, a.max_auctions, a.core.batch_wait_s,
                b.retention.ended_max,
                b.committer.gap_s) == (3, 64, 4, 0.005, 7, 0.025)
        # each value given is pinned: the tuner leaves it alone
        t = a.tuner
        assert (t.pinned_batch_max, t.pinned_max_auctions, t.pinned_gap_s) == (64, 4, 0.025)
    finally:
        b.committer.close()
    plain = make_broker(load(BrokerConfig, BROKER_OPTIONS, file=None, env={"GAVEL_STATE": "s"}),
                        {})
    try:  # the defaults: broadcast, no batch wait, and the rest tuned from the latency end
        a = plain.auctioneer
        first = LADDER[0]
        assert (a.core.sample_d, a.batch_max, a.max_auctions, a.core.batch_wait_s,
                plain.retention.ended_max, plain.committer.gap_s) == (
                    None, first.batch_max, first.max_auctions, 0.0, 100_000, first.gap_cap_s)
        t = a.tuner
        assert (t.pinned_batch_max, t.pinned_max_auctions, t.pinned_gap_s) == (None,) * 3
    finally:
        plain.committer.close()


@pytest.mark.parametrize(("text", "expected"), [
    ('state = "s"\nsample_d = -1\n', "field `sample_d` expected `int` >= 0."),
    ('state = "s"\nbatch_max = 0\n', "field `batch_max` expected `int` >= 1."),
    ('state = "s"\nbatch_wait_ms = nan\n', "field `batch_wait_ms` expected `float` >= 0.0."),
    ('state = "s"\nbatch_wait_ms = inf\n', "field `batch_wait_ms` expected `float` <= 60000"),
    ('state = "s"\nended_max = -1\n', "field `ended_max` expected `int` >= 0."),
    ('state = "s"\ncommit_gap_ms = -5\n', "field `commit_gap_ms` expected `float` >= 0.0."),
    ('state = "s"\ncommit_gap_ms = 1e6\n', "field `commit_gap_ms` expected `float` <= 10000"),
])
def test_bad_auction_settings_name_the_field(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load(BrokerConfig, BROKER_OPTIONS, file=write(tmp_path, text), env={})


@pytest.mark.parametrize(("ref", "words"), [
    ("refs/heads/a..b", "active ref 'refs/heads/a..b' is not a valid git ref name."),
    ("bad name", "active ref 'bad name' is not a valid git ref name."),
])
def test_a_ref_git_cannot_hold_is_a_config_error(tmp_path: Path, ref: str, words: str) -> None:
    from gavel.cli.daemons import make_broker

    cfg = load(BrokerConfig, BROKER_OPTIONS, file=None,
               env={"GAVEL_STATE": str(tmp_path / "s"), "GAVEL_REF": ref})
    with pytest.raises(ConfigError, match=re.escape(words)):
        make_broker(cfg, {})


@pytest.mark.parametrize(("daemon", "words"), [
    (["broker"], "gavel broker: cannot open state repository"),
    (["worker", "--node-id", "n1"], "gavel worker: field `state`: cannot keep the worker's "
     "state in"),
])
def test_a_state_path_that_is_a_file_exits_2_with_one_sentence(
        tmp_path: Path, daemon: list[str], words: str) -> None:
    import subprocess
    import sys

    (tmp_path / "afile").write_text("x")
    proc = subprocess.run([sys.executable, "-m", "gavel", *daemon, "--state",
                           str(tmp_path / "afile"), "--nats", "nats://127.0.0.1:9"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(words), proc.stderr


@pytest.mark.parametrize(("argv", "words"), [
    (["up", "--workers", "1", "--state"], "gavel up: --state {f}: cannot keep gavel's state "
     "there (Not a directory)."),
    (["sim", "smoke", "--quiet", "--no-plots", "--out"], "gavel sim: --out {f}: cannot write "
     "the results there (File exists)."),
    (["bench", "--json", "--state"], "gavel bench: --state {f}: cannot keep the run's state "
     "there (Not a directory)."),
])
def test_an_output_directory_that_is_a_file_exits_2_with_one_sentence(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
        words: str) -> None:
    f = tmp_path / "afile"
    f.write_text("x")
    assert cli.main([*argv, str(f)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == words.format(f=f)


# -- the address a worker advertises, and the gateway's settings -----------------------------
def test_a_worker_advertises_the_address_it_is_given_or_the_hosts(tmp_path: Path) -> None:
    assert worker(["--node-id", "n"]).advertise == ""  # the agent asks the host
    assert worker(["--node-id", "n"], env={"GAVEL_ADVERTISE": "10.1.2.3"}).advertise == \
        "10.1.2.3"
    file = write(tmp_path, 'node_id = "n"\nadvertise = "worker-1.internal"\n')
    assert worker([], file=file).advertise == "worker-1.internal"
    assert worker(["--advertise", "fd00::0:1"], file=file).advertise == "fd00::1"
    with pytest.raises(ConfigError, match=r"environment variable GAVEL_ADVERTISE: address "
                                          r"'a b' is neither an IP address nor a DNS name"):
        worker(["--node-id", "n"], env={"GAVEL_ADVERTISE": "a b"})
    bad = write(tmp_path, 'node_id = "n"\nadvertise = "-x-"\n', "bad.toml")
    with pytest.raises(ConfigError, match=rf"config file {re.escape(bad)}: field `advertise`"):
        worker([], file=bad)


def test_the_host_has_a_primary_address() -> None:
    import ipaddress

    from gavel.worker.hoststats import primary_address

    assert ipaddress.ip_address(primary_address()).version == 4


def gateway(argv: list[str], file: str | None = None, env: dict[str, str] | None = None
            ) -> GatewayConfig:
    args = cli.build_parser().parse_args(["gateway", *argv])
    return load(GatewayConfig, GATEWAY_OPTIONS, file=file, env=env or {},
                flags=flags_of(args, GATEWAY_OPTIONS))


def test_gateway_settings_file_then_env_then_flags(tmp_path: Path) -> None:
    plain = gateway(["--trust-advertised-addresses"])
    assert (plain.admin, plain.server, plain.listen, plain.static_roots) == (
        "http://127.0.0.1:2019", "gavel", [":8080"], [])
    file = write(tmp_path, 'admin = "http://caddy:2019"\nlisten = ["127.0.0.1:80"]\n'
                 'static_roots = ["/srv/www"]\n')
    cfg = gateway(["--listen", ":8081,[::1]:8082"], file=file,
                  env={"GAVEL_GATEWAY_SERVER": "edge", "GAVEL_STATIC_ROOTS": "/srv/a,/srv/b",
                       "GAVEL_TRUST_ADVERTISED_ADDRESSES": "1"})
    assert (cfg.admin, cfg.server, cfg.listen, cfg.static_roots) == (
        "http://caddy:2019", "edge", [":8081", "[::1]:8082"], ["/srv/a", "/srv/b"])
    out = tomllib.loads(render(cfg))
    assert out["admin"] == "http://caddy:2019" and out["listen"] == [":8081", "[::1]:8082"]


@pytest.mark.parametrize(("argv", "text", "words"), [
    (["--admin", "caddy:2019"], "", "admin URL 'caddy:2019' is not of the form http://HOST:PORT"),
    (["--admin", "http://caddy:99999"], "", "is not of the form http://HOST:PORT"),
    (["--listen", "8080"], "", "listen address '8080' is not of the form [HOST]:PORT"),
    (["--listen", "a b:80"], "", "is not of the form [HOST]:PORT"),
    (["--static-roots", "srv"], "", "'srv' is not an absolute path"),
    ([], 'admin = "ftp://x"\n', "field `admin`: admin URL 'ftp://x' is not of the form"),
    ([], "listen = []\n", "field `listen` names at least one address"),
    ([], 'server = "a.b"\n', "field `server`"),
    ([], 'static_roots = ["rel"]\n', "field `static_roots`: 'rel' is not an absolute path"),
    (["--admin", "unix://rel.sock"], "", "is not of the form unix:///absolute/path"),
    (["--reserved-ports", "2019,0"], "", "'0' must be greater than 0"),
    ([], 'nodes = "/nonexistent/nodes.json"\n', "field `nodes`: cannot read the node book"),
    ([], "reserved_ports = [70000]\n", "reserved_ports"),
])
def test_bad_gateway_settings_exit_2_naming_the_field(
        tmp_path: Path, argv: list[str], text: str, words: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    if argv:
        with pytest.raises(SystemExit) as exc:
            cli.main(["gateway", *argv, "--check"])
        assert exc.value.code == 2
        assert words in capsys.readouterr().err
        return
    file = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        gateway([], file=file)
    assert words in str(err.value)
    assert cli.main(["gateway", "--config", file, "--check"]) == 2
    assert words in capsys.readouterr().err


def test_a_gateway_config_checks_and_renders(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["gateway", "--check", "--listen", "127.0.0.1:8088",
                     "--trust-advertised-addresses"]) == 0
    out = capsys.readouterr().out
    assert "trust_advertised_addresses = true" in out
    assert 'listen = ["127.0.0.1:8088"]' in out and 'admin = "http://127.0.0.1:2019"' in out


def test_a_gateway_without_a_node_book_refuses_to_start_unless_told_to_trust_nodes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What a node advertises is its own word (issue 29, finding 3): a gateway started by hand
    without --nodes used to follow it with only a warning. Now it does not start, saying
    why, unless the operator opts in by flag, variable or file."""
    with pytest.raises(ConfigError) as err:
        gateway([])
    assert str(err.value) == NO_NODE_BOOK
    assert cli.main(["gateway", "--check"]) == 2
    assert NO_NODE_BOOK in capsys.readouterr().err
    assert gateway(["--trust-advertised-addresses"]).trust_advertised_addresses
    assert gateway([], env={"GAVEL_TRUST_ADVERTISED_ADDRESSES": "true"}).nodes == ""
    assert gateway([], file=write(tmp_path, "trust_advertised_addresses = true\n")).nodes == ""
    with pytest.raises(ConfigError, match=re.escape(NO_NODE_BOOK)):
        gateway([], env={"GAVEL_TRUST_ADVERTISED_ADDRESSES": "0"})
    book = nodebook.record(tmp_path, dict([entry("n1=10.0.0.1:20000-20999")]))
    assert gateway(["--nodes", str(book)]).nodes == str(book)
