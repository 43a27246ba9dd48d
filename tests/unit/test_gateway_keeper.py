"""The gateway keeper's own rules, in memory: a failure is said once per interval, a static
root outside the gateway's own is never served."""

from __future__ import annotations

import logging

import pytest

from gavel.gateway.admin import Admin
from gavel.gateway.keeper import BACKOFF_MAX, Complaint, Keeper, backoff
from gavel.shared.routes import RouteEntry
from gavel.shared.timing import Timing


def test_a_failure_is_said_when_it_starts_once_per_interval_and_when_it_ends(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    c = Complaint("Caddy", every_s=60.0, clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="gavel.gateway")
    for _ in range(50):  # retried with back-off: many failures within the interval
        c.failed("Caddy refused")
        now[0] += 1.0
    now[0] = 161.0
    c.failed("Caddy refused")
    c.recovered()
    c.recovered()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["Caddy refused; retrying with back-off",
                     "Caddy refused: still failing, 51 errors in 61 s; retrying",
                     "Caddy answers again, after 51 errors"]
    caplog.clear()
    c.failed("down again")
    assert [r.getMessage() for r in caplog.records] == ["down again; retrying with back-off"]


def test_a_static_root_is_served_only_under_the_gateways_static_roots(
        caplog: pytest.LogCaptureFixture) -> None:
    keeper = Keeper(nc=None, admin=Admin("http://127.0.0.1:1"), timing=Timing(),
                    static_roots=["/srv/www/", "/data"])
    table = [RouteEntry(id=f"gavel-s-{i}", name="s", path=f"/{i}", files=root, root=root)
             for i, root in enumerate(["/srv/www/site", "/srv/www", "/srv/wwwx", "/etc",
                                       "/data/x"])]
    table.append(RouteEntry(id="gavel-own", name="own", path="/own", files="out",
                            root="/var/lib/gavel/instances/own-1/out"))
    with caplog.at_level(logging.WARNING, logger="gavel.gateway"):
        kept = keeper._allowed(table)
        kept_again = keeper._allowed(table)
    assert [e.root for e in kept] == ["/srv/www/site", "/srv/www", "/data/x",
                                      "/var/lib/gavel/instances/own-1/out"]
    assert kept_again == kept
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "serves /srv/wwwx, outside every static root" in said[0]
    nothing = Keeper(nc=None, admin=Admin("http://127.0.0.1:1"), timing=Timing())
    assert [e.id for e in nothing._allowed(table)] == ["gavel-own"]


def test_a_failing_step_backs_off_doubling_up_to_its_cap_and_a_good_one_resets_it() -> None:
    tick = 0.5
    delays = []
    delay = tick
    for _ in range(8):
        delay = backoff(delay, False, tick)
        delays.append(delay)
    assert delays == [1.0, 2.0, 2.5, 2.5, 2.5, 2.5, 2.5, 2.5] and BACKOFF_MAX * tick == 2.5
    assert backoff(delay, True, tick) == tick
    assert backoff(tick, False, tick) == 2 * tick  # the first failure: twice a tick
