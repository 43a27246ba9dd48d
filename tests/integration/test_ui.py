"""The dashboard in a real headless Chromium, against a live `gavel up` (a real child process
of ``python -m gavel up``: nats-server with nkeys, a broker, three workers, the dashboard it
serves) and the real CLI: the page lists the nodes, shows an instance the CLI submits without
a reload, draws its auction with the winner marked beside its log lines, shows a service the
CLI deploys, and on another address lets in only the holder of the token.

Skipped when playwright (the test extras) or a Chromium (``apt-get install -y chromium``; or
GAVEL_CHROMIUM=/path) is missing. GAVEL_UI_SCREENSHOT=FILE also saves a screenshot of the
dashboard with a few instances placed (docs/dashboard.png is made so).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is in the test extras: pip install -e '.[test]'")

from gavel.transport.natsserver import free_port  # noqa: E402
from tests.integration.harness import gavel_process  # noqa: E402

CHROMIUM = os.environ.get("GAVEL_CHROMIUM") or shutil.which("chromium") or \
    shutil.which("chromium-browser") or "/usr/bin/chromium"
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason="no Chromium: apt-get install -y chromium (or GAVEL_CHROMIUM)"),
]
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
#: Milliseconds the page may take to show what a test waits for (a busy machine is slow).
WAIT_MS = 60_000


@dataclass
class Up:
    url: str
    nats: str
    creds: str
    dir: Path
    log: Path

    def gavel(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A client verb of the real CLI against this cluster."""
        return subprocess.run([sys.executable, "-m", "gavel", *args, "--nats", self.nats,
                               "--creds", self.creds], capture_output=True, text=True,
                              timeout=120)

    def submit(self, name: str, iid: str, **spec: Any) -> None:
        path = self.dir / f"{iid}.json"
        path.write_text(json.dumps({"name": name, "command": [
            sys.executable, "-c", "import time\nprint('up', flush=True)\ntime.sleep(300)"],
            "cpu": 0.5, "memory_mb": 128, **spec}))
        done = self.gavel("submit", str(path), "--id", iid)
        assert done.returncode == 0, done.stderr

    def node_of(self, iid: str) -> str:
        done = self.gavel("status", iid, "--json")
        assert done.returncode == 0, done.stderr
        node: str = json.loads(done.stdout)[0]["node_id"]
        return node


def _until(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def _printed(log: Path, pattern: str, proc: subprocess.Popen[bytes]) -> re.Match[str]:
    def found() -> re.Match[str] | None:
        assert proc.poll() is None, log.read_text()
        return re.search(pattern, log.read_text())
    match: re.Match[str] = _until(found, 90, f"{pattern!r} in {log}")
    return match


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    root = tmp_path_factory.mktemp("ui")
    nats_port = free_port()
    log = root / "up.log"
    proc = gavel_process(["up", "--state", str(root / "state"), "--workers", "3",
                          "--nats-port", str(nats_port), "--ui-port", "0"], log)
    try:
        m = _printed(log, r"dashboard: (http://127\.0\.0\.1:\d+/)\n", proc)
        yield Up(url=m.group(1), nats=f"nats://127.0.0.1:{nats_port}",
                 creds=str(root / "state" / "auth" / "operator.nk"), dir=root, log=log)
    finally:
        _stop(proc)


@pytest.fixture
def page() -> Iterator[Any]:
    """A page of a Chromium with a profile of its own (no cookie carried between tests)."""
    with sync_api.sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        ctx = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=ARGS,
            viewport={"width": 1400, "height": 900})
        try:
            pg = ctx.pages[0] if ctx.pages else ctx.new_page()
            errors: list[str] = []
            pg.on("pageerror", lambda exc: errors.append(str(exc)))
            yield pg
            assert errors == [], errors  # the page's script never threw
        finally:
            ctx.close()


def _nodes_listed(page: Any) -> None:
    for node in ("node-1", "node-2", "node-3"):
        page.wait_for_selector(f'#nodes [data-node="{node}"] .b-healthy', timeout=WAIT_MS)


def test_the_page_lists_the_nodes_of_a_live_gavel_up(up: Up, page: Any) -> None:
    page.goto(up.url)
    _nodes_listed(page)
    cards = page.locator("#nodes article.node")
    assert cards.count() == 3
    card = page.locator('#nodes [data-node="node-2"]')
    assert "binpack" in card.inner_text() and "zone=b" in card.inner_text()
    # Committed cpu and memory, and what the node's instances use (its own load), as bars.
    meters = card.locator(".meter")
    assert [meters.nth(k).get_attribute("data-meter") for k in range(meters.count())] == [
        "committed cpu", "committed memory", "node cpu used", "node memory used"]
    page.wait_for_selector("#live.on", timeout=WAIT_MS)


def test_a_service_deployed_with_the_cli_is_shown_with_its_replicas(up: Up, page: Any) -> None:
    page.goto(up.url)
    page.wait_for_selector("#services-section:not([hidden])", timeout=WAIT_MS)
    spec = up.dir / "svc.json"
    spec.write_text(json.dumps({"name": "ui-svc", "type": "service", "count": 2, "cpu": 0.25,
                                "memory_mb": 64, "command": [
                                    sys.executable, "-c", "import time; time.sleep(300)"]}))
    done = up.gavel("deploy", str(spec))
    assert done.returncode == 0, done.stderr
    row = page.locator('#services tr[data-service="ui-svc"]')
    row.wait_for(timeout=WAIT_MS)
    page.wait_for_function(
        "() => document.querySelector('#services tr[data-service=\"ui-svc\"] td:nth-child(3)')"
        ".textContent === '2 / 2'", timeout=WAIT_MS)
    assert row.locator("td").nth(1).inner_text() == "v1"
    page.wait_for_selector('#instances tr[data-state="running"] .sub', timeout=WAIT_MS)
    # Its row is rebuilt only when what it shows changes, not by every overview pushed (they
    # also carry its replicas' usage, which moves with each heartbeat): the link a user is
    # clicking stays the element under the pointer.
    cells = ("[...document.querySelectorAll('#services tr[data-service=\"ui-svc\"] td')]"
             ".map(c => c.textContent).join('|')")
    link = "document.querySelector('#services tr[data-service=\"ui-svc\"] a.service-link')"
    page.wait_for_function(f"() => {cells}.split('|')[3] === '2'", timeout=WAIT_MS)
    before = page.evaluate(f"(() => {{ {link}.__kept = true; return {cells}; }})()")
    for _ in range(2):  # two more overviews pushed to the page
        page.evaluate("window.__seen = state.overview")
        page.wait_for_function("() => state.overview !== window.__seen", timeout=WAIT_MS)
    after, kept = page.evaluate(f"[{cells}, {link}.__kept === true]")
    assert kept == (after == before), (before, after)  # kept unless what it shows changed
    # Its own page: each version and each replica, by the service's link.
    row.locator("a.service-link").click()
    page.wait_for_selector("#service-page:not([hidden])", timeout=WAIT_MS)
    assert page.evaluate("location.hash") == "#/service/ui-svc"
    page.wait_for_function(
        "() => document.querySelectorAll('#service-replicas tbody tr').length === 2",
        timeout=WAIT_MS)
    assert page.locator('#service-versions tr[data-version="1"] td').nth(1).inner_text() == "2"


def test_an_instance_submitted_with_the_cli_appears_without_a_reload(up: Up,
                                                                     page: Any) -> None:
    page.goto(up.url)
    _nodes_listed(page)
    page.evaluate("window.__not_reloaded = true")
    up.submit("appear", "ui-appear-1")
    page.wait_for_selector('#instances tr[data-instance="ui-appear-1"][data-state="running"]',
                           timeout=WAIT_MS)
    page.wait_for_selector('#events [data-event-instance="ui-appear-1"]'
                           '[data-event-type="running"]', timeout=WAIT_MS)
    assert page.evaluate("window.__not_reloaded") is True
    row = page.locator('#instances tr[data-instance="ui-appear-1"]')
    assert row.get_attribute("data-node") == up.node_of("ui-appear-1")


def test_clicking_an_instance_shows_its_auction_with_the_winner_marked(up: Up,
                                                                       page: Any) -> None:
    up.submit("pick", "ui-pick-1")
    up.submit("eu", "ui-eu-1", labels={"zone": "b"})  # only node-2 is in zone b
    page.goto(up.url)
    page.wait_for_selector('#instances tr[data-instance="ui-pick-1"][data-state="running"]',
                           timeout=WAIT_MS)
    page.click('#instances tr[data-instance="ui-pick-1"] a')
    page.wait_for_selector("#instance-page .auction .bid.winner", timeout=WAIT_MS)
    assert page.evaluate("location.hash") == "#/instance/ui-pick-1"
    assert page.locator("#overview-page").is_hidden()
    winner = page.locator("#auctions .auction").first.locator(".bid.winner")
    assert winner.count() == 1
    assert winner.get_attribute("data-node") == up.node_of("ui-pick-1")
    assert winner.locator(".winner-mark").inner_text().strip().endswith("winner")
    bids = page.locator("#auctions .auction").first.locator(".bid")
    assert bids.count() == 3  # every node bid, each a bar
    at = page.locator("#auctions .auction").first.locator(".auction-at")
    assert abs(float(at.get_attribute("data-at")) - time.time()) < 3600  # when, committed
    assert re.fullmatch(r"\d\d:\d\d:\d\d", at.inner_text().strip())
    loads = [float(bids.nth(k).get_attribute("data-load")) for k in range(3)]
    assert loads == sorted(loads)
    assert page.locator("#auctions .auction").first.locator(".bid:not(.winner) "
                                                            ".winner-mark").count() == 0
    # Its recent log lines, read from its node through `gavel logs`'s API.
    page.wait_for_selector("#logs .line.stdout", timeout=WAIT_MS)
    assert page.locator("#logs .line.stdout").first.inner_text().strip() == "up"
    # Its usage over the last minutes, measured from its cgroup: a small graph each.
    page.wait_for_selector("#instance-usage .usage-graph.memory svg polyline",
                           timeout=WAIT_MS)
    graphs = page.locator("#instance-usage .usage-graph")
    assert [graphs.nth(k).locator(".usage-label").inner_text() for k in range(2)] == [
        "cpu", "memory"]
    assert int(graphs.nth(1).get_attribute("data-points")) >= 2
    assert re.fullmatch(r"[\d.]+ MB now, [\d.]+ at most",
                        graphs.nth(1).locator(".mono").inner_text().strip())
    # Another instance, through the page's own link: the nodes that declined, and why.
    page.click('a[href="#/"]')
    page.click('#instances tr[data-instance="ui-eu-1"] a')
    page.wait_for_selector('#auctions .bid.winner[data-node="node-2"]', timeout=WAIT_MS)
    declines = page.locator("#auctions .auction").first.locator(".decline")
    assert sorted(declines.nth(k).get_attribute("data-node") for k in range(2)) == [
        "node-1", "node-3"]
    assert all(declines.nth(k).locator(".reason").inner_text() == "missing label zone=b"
               for k in range(2))


def test_ended_instances_are_hidden_until_asked_for_and_a_node_has_its_page(
        up: Up, page: Any, tmp_path: Path) -> None:
    up.submit("live", "ui-live-1")
    up.submit("gone", "ui-end-1")
    page.goto(up.url)
    page.wait_for_selector('#instances tr[data-instance="ui-live-1"][data-state="running"]',
                           timeout=WAIT_MS)
    page.wait_for_selector('#instances tr[data-instance="ui-end-1"][data-state="running"]',
                           timeout=WAIT_MS)
    done = up.gavel("cancel", "ui-end-1")
    assert done.returncode == 0, done.stderr
    page.wait_for_function(
        "() => state.overview.instances.some("
        "(i) => i.instance_id === 'ui-end-1' && i.state === 'cancelled')", timeout=WAIT_MS)
    assert page.locator('#instances tr[data-instance="ui-end-1"]').count() == 0  # hidden
    assert page.locator("#ended-count").inner_text() != "(0)"
    page.check("#show-ended")
    page.wait_for_selector('#instances tr[data-instance="ui-end-1"][data-state="cancelled"]',
                           timeout=WAIT_MS)
    page.uncheck("#show-ended")
    page.wait_for_selector('#instances tr[data-instance="ui-end-1"]', state="detached",
                           timeout=WAIT_MS)
    if os.environ.get("GAVEL_UI_SCREENSHOT"):
        page.screenshot(path=str(Path(os.environ["GAVEL_UI_SCREENSHOT"]).with_suffix(
            ".overview.png")))
    # A node's own page, by the link in the instance's row: its card and what runs there.
    node = up.node_of("ui-live-1")
    page.locator('#instances tr[data-instance="ui-live-1"] a.node-link').click()
    page.wait_for_selector("#node-page:not([hidden])", timeout=WAIT_MS)
    assert page.evaluate("location.hash") == f"#/node/{node}"
    page.wait_for_selector(f'#node-card [data-node="{node}"] .meter', timeout=WAIT_MS)
    page.wait_for_selector('#node-instances tr[data-instance="ui-live-1"]', timeout=WAIT_MS)
    assert page.locator('#node-instances tr[data-instance="ui-end-1"]').count() == 0
    if os.environ.get("GAVEL_UI_SCREENSHOT"):
        page.screenshot(path=str(Path(os.environ["GAVEL_UI_SCREENSHOT"]).with_suffix(
            ".node.png")))


def test_the_token_is_required_on_a_non_loopback_address(up: Up, page: Any) -> None:
    port = free_port()
    log = up.dir / "ui-token.log"
    proc = gavel_process(["ui", "--nats", up.nats, "--creds", up.creds, "--addr", "0.0.0.0",
                          "--port", str(port)], log)
    try:
        m = _printed(log, rf"dashboard at http://\S+:{port}/\?token=(\S+)", proc)
        token = m.group(1)
        base = f"http://127.0.0.1:{port}/"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + "api/overview", timeout=30)
        assert refused.value.code == 401
        assert page.goto(base).status == 401
        assert page.locator("#nodes").count() == 0  # no page without the token
        page.goto(f"{base}?token={token}")
        _nodes_listed(page)  # and its event stream came through on the cookie
        assert page.url == base  # the token left the address bar
        with urllib.request.urlopen(urllib.request.Request(
                base + "api/overview", headers={"Authorization": f"Bearer {token}"}),
                timeout=30) as ok:
            assert ok.status == 200
    finally:
        _stop(proc)
    assert log.read_text().count(token) == 1  # printed once


def test_a_screenshot_of_the_dashboard_when_asked(up: Up, page: Any) -> None:
    out = os.environ.get("GAVEL_UI_SCREENSHOT")
    if not out:
        pytest.skip("GAVEL_UI_SCREENSHOT=FILE saves one")
    for iid, spec in [("web-1", {"ports": ["http"], "cpu": 1.0, "memory_mb": 512}),
                      ("web-2", {"ports": ["http"], "cpu": 1.0, "memory_mb": 512}),
                      ("report-eu", {"labels": {"zone": "b"}, "memory_mb": 256}),
                      ("big", {"cpu": 3.0, "memory_mb": 3072}),
                      ("needs-gpu", {"labels": {"gpu": "true"}})]:
        up.submit(iid.split("-")[0], iid, **spec)
    page.goto(up.url)
    for iid in ("web-1", "web-2", "report-eu", "big"):
        page.wait_for_selector(f'#instances tr[data-instance="{iid}"][data-state="running"]',
                               timeout=WAIT_MS)
    page.wait_for_selector('#instances tr[data-instance="needs-gpu"]'
                           '[data-state="unschedulable"]', timeout=WAIT_MS)
    page.wait_for_timeout(2500)  # another overview or two: the loads settle
    page.screenshot(path=out, full_page=False)


def test_a_system_job_shows_on_how_many_of_its_nodes_it_runs(up: Up, page: Any) -> None:
    page.goto(up.url)
    page.wait_for_selector("#services-section:not([hidden])", timeout=WAIT_MS)
    spec = up.dir / "agent.json"
    spec.write_text(json.dumps({"name": "ui-agent", "type": "system", "cpu": 0.1,
                                "memory_mb": 32, "command": [
                                    sys.executable, "-c", "import time; time.sleep(300)"]}))
    done = up.gavel("submit", str(spec), "--wait", "--timeout", "110")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ui-agent running on 3 nodes"), done.stdout
    page.wait_for_function(
        "() => { const td = document.querySelector("
        "'#services tr[data-service=\"ui-agent\"] td:nth-child(3)');"
        " return td && td.textContent === 'system: 3 / 3 nodes'; }", timeout=WAIT_MS)


def test_a_periodic_job_shows_its_schedule_and_latest_run(up: Up, page: Any) -> None:
    page.goto(up.url)
    _nodes_listed(page)
    spec = up.dir / "tick.json"
    spec.write_text(json.dumps({"name": "ui-tick", "command": ["true"], "cpu": 0.1,
                                "memory_mb": 32, "schedule": "* * * * * *"}))
    done = up.gavel("submit", str(spec))
    assert done.returncode == 0 and done.stdout.strip() == "ui-tick", done.stderr
    page.wait_for_selector('#periodic-section:not([hidden]) tr[data-periodic="ui-tick"]',
                           timeout=WAIT_MS)
    cells = "document.querySelectorAll('#periodic tr[data-periodic=\"ui-tick\"] td')"
    page.wait_for_function(f"() => {cells}[3].textContent.endsWith(': succeeded')",
                           timeout=WAIT_MS)
    assert page.evaluate(f"{cells}[1].textContent") == "* * * * * * (UTC)"
    done = up.gavel("cancel", "ui-tick")
    assert done.returncode == 0, done.stderr
    page.wait_for_function(f"() => {cells}[4].textContent === 'cancelled'", timeout=WAIT_MS)


def test_a_batch_array_and_a_preemption_are_drawn(up: Up, page: Any) -> None:
    """A batch array's row with its tally; a displacing award's auction with the preempting
    offer taken and the displaced instance linked; the displaced one names its preemptor."""
    page.goto(up.url)
    _nodes_listed(page)
    spec = up.dir / "arr.json"
    spec.write_text(json.dumps({"name": "ui-arr", "command": ["true"], "cpu": 0.1,
                                "memory_mb": 32, "count": 3, "parallelism": 1}))
    done = up.gavel("submit", str(spec), "--id", "ui-arr")
    assert done.returncode == 0, done.stderr
    cells = "document.querySelectorAll('#arrays tr[data-array=\"ui-arr\"] td')"
    page.wait_for_selector('#arrays-section:not([hidden]) tr[data-array="ui-arr"]'
                           '[data-ended="yes"]', timeout=WAIT_MS)
    assert page.evaluate(f"[...{cells}].map((td) => td.textContent)") == [
        "ui-arr", "3 (1 at once)", "3", "0", "0", "0", "every task succeeded"]
    # Low-priority work fills node-2 (the only node in zone b); urgent work for zone b
    # displaces it.
    done = up.gavel("nodes", "--json")
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    node = next(n for n in listed["nodes"] if n["node_id"] == "node-2")
    free = round(node["capacity"]["cpu"] - node["committed"]["cpu"], 3)
    assert free > 0, node
    up.submit("low", "ui-low", labels={"zone": "b"}, cpu=free, memory_mb=32, priority=10)
    up.submit("urgent", "ui-urgent", labels={"zone": "b"}, cpu=free, memory_mb=32,
              priority=80)
    page.goto(f"{up.url}#/instance/ui-urgent")
    page.wait_for_selector('#auctions .offer.taken[data-node="node-2"]', timeout=WAIT_MS)
    auction = page.locator("#auctions .auction").first
    assert "would stop ui-low (priority 10)" in auction.locator(".offer.taken").inner_text()
    assert auction.locator(".displaced a.instance-link").inner_text() == "ui-low"
    auction.locator(".displaced a.instance-link").click()
    page.wait_for_selector('#instance-status .preempted[data-preemptor="ui-urgent"]',
                           timeout=WAIT_MS)
    said = page.locator("#instance-status .preempted").first.inner_text()
    assert "preempted on node-2 by ui-urgent (priority 80)" in said
