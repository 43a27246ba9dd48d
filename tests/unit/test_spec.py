"""A spec as the operator writes it: jobs and services, restart policy, checks, spread,
updates - the defaults Nomad users know, and every mistake refused with a sentence."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gavel.cli.specfile import SpecError, load_spec
from gavel.shared.spec import Check, Restart, Route, Spec, Update, restart_policy


def spec(**kw: object) -> Spec:
    return msgspec.convert({"name": "web", "command": ["true"], **kw}, Spec)


def test_a_spec_written_before_services_is_still_a_job_of_one() -> None:
    s = spec()
    assert (s.type, s.count, s.checks, s.spread, s.service) == ("job", 1, [], None, False)
    assert s.update == Update()


def test_each_type_has_nomads_restart_policy_field_by_field() -> None:
    job = restart_policy(spec())
    assert (job.attempts, job.interval_s, job.delay_s, job.backoff, job.max_delay_s) == (
        3, 86_400.0, 15.0, 2.0, 300.0)
    service = restart_policy(spec(type="service"))
    assert (service.attempts, service.interval_s) == (2, 1_800.0)
    mine = restart_policy(spec(type="service", restart={"attempts": 5, "delay_s": 1}))
    assert (mine.attempts, mine.interval_s, mine.delay_s) == (5, 1_800.0, 1.0)


def test_restart_delays_back_off_up_to_their_cap() -> None:
    policy = restart_policy(spec(restart={"delay_s": 1, "backoff": 3, "max_delay_s": 20}))
    assert [policy.delay(k) for k in (1, 2, 3, 4)] == [1.0, 3.0, 9.0, 20.0]
    flat = restart_policy(spec(restart={"delay_s": 2, "backoff": 1}))
    assert [flat.delay(k) for k in (1, 5)] == [2.0, 2.0]


def test_checks_name_what_they_check() -> None:
    s = spec(ports=["http"], checks=[{"type": "http", "port": "http", "path": "/health"},
                                     {"type": "tcp", "port": "http"},
                                     {"type": "exec", "command": ["curl", "-f", "x"]}])
    assert [c.label for c in s.checks] == ["http http/health", "tcp http", "exec curl"]
    assert s.checks[0].interval_s == 10.0 and s.checks[0].failures == 3


@pytest.mark.parametrize(("fields", "words"), [
    ({"checks": [{"type": "http", "path": "/"}]}, "names the port it checks"),
    ({"checks": [{"type": "exec"}]}, "names its command"),
    ({"checks": [{"type": "tcp", "port": "http", "command": ["x"]}], "ports": ["http"]},
     "takes no command"),
    ({"checks": [{"type": "http", "port": "http", "path": "health"}], "ports": ["http"]},
     "starts with /"),
    ({"checks": [{"type": "tcp", "port": "admin"}], "ports": ["http"]},
     "does not declare in ports"),
    ({"checks": [{"type": "udp", "port": "http"}], "ports": ["http"]}, "checks[0].type"),
    ({"spread": "zone"}, "applies to a service"),
    ({"count": 0}, "a job's count is at least 1"),
    ({"restart": {"attempts": -1}}, "restart.attempts"),
    ({"restart": {"interval_s": 0}}, "restart.interval_s"),
    ({"restart": {"atempts": 2}}, "unknown field"),
    ({"update": {"max_parallel": 0}}, "update.max_parallel"),
    ({"type": "daemon"}, "type"),
])
def test_a_bad_spec_is_refused_with_a_sentence(tmp_path: Path, fields: dict[str, object],
                                               words: str) -> None:
    path = tmp_path / "web.json"
    path.write_bytes(msgspec.json.encode({"name": "web", "command": ["true"], **fields}))
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert words in str(err.value) and str(err.value).startswith(f"{path}: invalid spec")


def test_a_service_spec_in_toml(tmp_path: Path) -> None:
    path = tmp_path / "web.toml"
    path.write_text('''
name = "web"
type = "service"
count = 3
command = ["python3", "-m", "http.server"]
ports = ["http"]
spread = "zone"
spread_soft = true

[restart]
attempts = 4
delay_s = 1

[[checks]]
type = "http"
port = "http"
path = "/"
interval_s = 2

[update]
max_parallel = 2
min_healthy_s = 5
''')
    s = load_spec(path)
    assert s.service and s.count == 3 and s.spread == "zone" and s.spread_soft
    assert s.restart == Restart(attempts=4, delay_s=1.0)
    assert s.checks == [Check(type="http", port="http", path="/", interval_s=2.0)]
    assert (s.update.max_parallel, s.update.min_healthy_s, s.update.auto_revert) == (2, 5.0,
                                                                                    True)


# -- routes --------------------------------------------------------------------------------
def test_routes_in_toml_reach_a_port_or_serve_files(tmp_path: Path) -> None:
    path = tmp_path / "web.toml"
    path.write_text('''
name = "web"
type = "service"
command = ["python3", "-m", "http.server"]
ports = ["http"]

[[routes]]
host = "web.example.com"
path = "/api/"
port = "http"
strip_prefix = true

[[routes]]
path = "/static"
files = "public"

[[routes]]
host = "*.docs.example.com"
files = "/srv/docs"
''')
    s = load_spec(path)
    assert s.routes == [
        Route(host="web.example.com", path="/api/", port="http", strip_prefix=True),
        Route(path="/static", files="public"), Route(host="*.docs.example.com",
                                                      files="/srv/docs")]
    assert [r.key for r in s.routes] == [("web.example.com", "/api"), ("", "/static"),
                                         ("*.docs.example.com", "")]
    # A files route's directory is mounted at its path; a port route's replicas see the
    # path as it came, unless the route says otherwise.
    assert [r.strips for r in s.routes] == [True, True, False]
    assert not Route(path="/api", port="http").strips
    assert not Route(path="/static", files="www", strip_prefix=False).strips
    assert spec().routes == []  # a spec written before routes has none


@pytest.mark.parametrize(("route", "words"), [
    ({"host": "Web.Example", "port": "http"}, "is not a valid DNS name"),
    ({"host": "web..example", "port": "http"}, "is not a valid DNS name"),
    ({"host": "-web.example", "port": "http"}, "is not a valid DNS name"),
    ({"host": "web_1.example", "port": "http"}, "is not a valid DNS name"),
    ({"host": "a." + "b" * 64, "port": "http"}, "is not a valid DNS name"),
    ({"path": "api", "port": "http"}, "must start with /"),
    ({"path": "/a b", "port": "http"}, "only the characters of an URL path"),
    ({"path": "/api/*", "port": "http"}, "only the characters of an URL path"),
    ({"path": "/a/../b", "port": "http"}, "'.' or '..' segment"),
    ({"path": "/api", "port": "admin"}, "names port 'admin', which the spec does not declare"),
    ({"path": "/api"}, "or serves files (files = \"...\"): give it one"),
    ({"path": "/api", "port": "http", "files": "www"}, "not both"),
    ({"port": "http"}, "a route names a host, a path prefix or both"),
    ({"path": "/files", "files": "../etc"}, "must not climb out"),
    ({"path": "/files", "files": " "}, "a route's files name a directory"),
    ({"host": "web.example", "port": "http", "strip_prefix": True}, "give the route a path"),
    ({"path": "/api", "port": "http", "weight": 2}, "unknown field"),
])
def test_a_bad_route_is_refused_with_a_sentence(tmp_path: Path, route: dict[str, object],
                                                words: str) -> None:
    path = tmp_path / "web.json"
    path.write_bytes(msgspec.json.encode({"name": "web", "command": ["true"],
                                          "ports": ["http"], "routes": [route]}))
    with pytest.raises(SpecError) as err:
        load_spec(path)
    text = str(err.value)
    assert words in text and text.startswith(f"{path}: invalid spec"), text
    assert "\n" not in text


def test_two_routes_of_one_spec_may_not_match_the_same_thing() -> None:
    with pytest.raises(msgspec.ValidationError, match="two routes of the spec match '/api'"):
        spec(ports=["http"], routes=[{"path": "/api", "port": "http"},
                                     {"path": "/api/", "files": "www"}])
    ok = spec(ports=["http"], routes=[{"path": "/api", "port": "http"},
                                      {"host": "a.example", "path": "/api", "port": "http"}])
    assert len(ok.routes) == 2
