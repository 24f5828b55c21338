"""The status page at / and /status.json: facts of a known layout, hostile names escaped, the
same auth as /metrics, and the page as a real headless Chromium renders it, with JavaScript
off (server-rendered) and on (refreshed from /status.json)."""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.request

import bcrypt
import pytest
import yaml

from exporter.http.status_page import StatusPage
from exporter.output.catalog import BY_NAME
from exporter.output.health import HealthBoard
from exporter.output.samples import SampleSet
from exporter.output.telemetry import Telemetry
from tests.chromium import Chromium
from tests.conftest import wait_for
from tests.layouts import iso

HOSTILE = '<img src=x onerror="document.title=1">'


@pytest.fixture
def layout(redis_client):
    """Three orchestrata queues (one named by an attacker), a key of the wrong type."""
    now = time.time()
    redis_client.rpush(
        "orchestrata:queue:billing:p1",
        *[json.dumps({"queued_at": iso(now - 600)})] * 3,
    )
    redis_client.rpush("orchestrata:queue:email:p2", json.dumps({"queued_at": iso(now - 60)}))
    redis_client.rpush(f"orchestrata:queue:{HOSTILE}:p1", json.dumps({"queued_at": iso(now)}))
    redis_client.zadd("orchestrata:queue:wrong:p1", {"a": 1})


def _get(port: int, path: str, auth: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _status(app) -> dict:
    """/status.json once the first Redis cycle has been reported."""

    def reported():
        document = json.loads(_get(app.server.port, "/status.json")[1])
        return document if document["key_groups"] and document["top_depth"] else None

    return wait_for(reported)


def test_status_json_states_what_was_found(layout, redis_url, run_exporter):
    app = run_exporter(redis_url=redis_url, preset=["orchestrata"])
    status = _status(app)
    assert status["ready"] is True and status["leader"] is True
    groups = {group["pattern"]: group for group in status["key_groups"]}
    queues = groups["orchestrata:queue:{queue}:p{priority}"]
    assert (queues["keys_matched"], queues["queues"], queues["series"]) == (4, 3, 3)
    assert queues["errors"] == {"wrong_type": 1}  # the one zset (its LLEN and LINDEX both fail)
    assert groups["orchestrata:dlq:{queue}"]["keys_matched"] == 0
    deepest = status["top_depth"][0]
    assert (deepest["queue"], deepest["priority"], deepest["value"]) == ("billing", "1", 3)
    oldest = status["top_oldest_age"][0]
    assert oldest["queue"] == "billing" and oldest["value"] >= 600
    redis = next(source for source in status["sources"] if source["name"] == "redis")
    assert redis["up"] is True and redis["errors"]["wrong_type"] >= 1
    warnings = status["view"]["warnings"]
    assert any("orchestrata:dlq:{queue}" in w and "matched no keys" in w for w in warnings)
    assert any("'orchestrata:queue:wrong:p1'" in w and "(a zset)" in w for w in warnings)


def test_a_stream_that_does_not_exist_is_a_warning(redis_client, redis_url, run_exporter):
    redis_client.xadd("events:present", {"v": "1"})
    app = run_exporter(redis_url=redis_url, events_stream=["events:present", "events:absent"])

    def both_consumers_reported():
        status = json.loads(_get(app.server.port, "/status.json")[1])
        return status if any(s["stream"] == "events:present" for s in status["streams"]) else None

    status = wait_for(both_consumers_reported)
    warnings = status["view"]["warnings"]
    assert any(w.startswith("stream events:absent has reported no lag yet") for w in warnings)
    assert not any("events:present" in w for w in warnings)


def test_the_top_queues_are_work_waiting_not_history():
    telemetry = Telemetry(HealthBoard())
    samples = SampleSet()
    depth = BY_NAME["queue_depth"]
    samples.add_labelled(depth, ("rq", "default", "", "completed"), 5000)
    samples.add_labelled(depth, ("rq", "default", "", "failed"), 300)
    samples.add_labelled(depth, ("rq", "default", "", "pending"), 7)
    samples.add_labelled(depth, ("rq", "reports", "", "scheduled"), 3)
    telemetry.publish("redis", samples)
    page = StatusPage(telemetry.health, telemetry.own_samples, telemetry.store.snapshot_series)
    top = [(q["queue"], q["state"], q["value"]) for q in page.document()["top_depth"]]
    assert top == [("default", "pending", 7), ("reports", "scheduled", 3)]
    telemetry.shutdown()


def test_html_escapes_hostile_names(layout, redis_url, run_exporter):
    app = run_exporter(redis_url=redis_url, preset=["orchestrata"])
    _status(app)
    code, body = _get(app.server.port, "/")
    assert code == 200
    page = body.decode()
    assert HOSTILE not in page
    assert "&lt;img src=x onerror=&quot;document.title=1&quot;&gt;" in page


def test_status_page_is_behind_the_same_auth_as_metrics(redis_url, run_exporter, tmp_path):
    password_hash = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
    web_config = tmp_path / "web.yml"
    web_config.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": password_hash}}))
    app = run_exporter(
        {"web_config_file": str(web_config)}, redis_url=redis_url, preset=["orchestrata"]
    )
    for path in ("/", "/status.json", "/metrics"):
        assert _get(app.server.port, path)[0] == 401
        assert _get(app.server.port, path, "prometheus:s3cret")[0] == 200


def _cells(dom: str, section: str) -> list[str]:
    """The text of the cells of one section's table (the DOM after load, as Chromium has it)."""
    from html.parser import HTMLParser

    class Cells(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.inside = False  # sections do not nest
            self.cell: list[str] | None = None
            self.found: list[str] = []

        def handle_starttag(self, tag, attrs):
            if tag == "section":
                self.inside = ("id", section) in attrs
            if tag == "td" and self.inside:
                self.cell = []

        def handle_endtag(self, tag):
            if tag == "section":
                self.inside = False
            if tag == "td" and self.cell is not None:
                self.found.append("".join(self.cell))
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell.append(data)

    parser = Cells()
    parser.feed(dom)
    return parser.found


@pytest.mark.parametrize("javascript", [False, True], ids=["javascript-off", "javascript-on"])
def test_chromium_shows_the_figures(layout, redis_url, run_exporter, tmp_path, javascript):
    app = run_exporter(redis_url=redis_url, preset=["orchestrata"])
    _status(app)
    browser = Chromium(tmp_path / "profile")
    try:
        url = f"http://127.0.0.1:{app.server.port}/"
        dom = browser.page_dom(url, javascript, settle='data-refreshed="' if javascript else None)
    finally:
        browser.close()

    # Refreshed from /status.json by the inline script only when JavaScript runs.
    assert ('data-refreshed="' in dom) is javascript
    depth = _cells(dom, "top-depth")
    assert depth[:5] == ["orchestrata", "billing", "1", "pending", "3"]
    assert HOSTILE.split(" ")[0] not in dom.replace("&lt;img", "")  # no element was injected
    assert HOSTILE in _cells(dom, "top-depth")  # the name shows as text
    groups = _cells(dom, "key-groups")
    row = groups.index("orchestrata:queue:{queue}:p{priority}")
    assert groups[row + 2 : row + 6] == ["4", "3", "3", "wrong_type 1"]
    assert "matched no keys" in dom
    sources = _cells(dom, "sources")
    assert sources[sources.index("redis") + 1] == "up"


@pytest.mark.parametrize(
    "name",
    [b"carriage\rreturn", b"nul\x00byte", b"bad\xff\xfeutf8", b"line\nfeed", b'quote"back\\'],
    ids=["CR", "NUL", "invalid-UTF-8", "LF", "quote-backslash"],
)
def test_the_status_page_survives_any_key(name, redis_client, redis_url, run_exporter):
    """Keys are data anyone with write access to Redis chose: / and /status.json answer 200
    whatever bytes a queue name holds, and the queue is listed."""
    redis_client.rpush(b"jobs:" + name, b"a", b"b", b"c")
    key_group = {"system": "app", "pattern": "jobs:{queue}", "type": "list", "state": "pending"}
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [key_group]}}})
    wait_for(lambda: b"queue_depth{" in _get(app.server.port, "/metrics")[1])
    code, body = _get(app.server.port, "/status.json")
    assert code == 200
    top = json.loads(body)["top_depth"]
    assert [entry["value"] for entry in top] == [3]
    assert top[0]["queue"].startswith(name[:3].decode())  # this key's queue, however shown
    code, page = _get(app.server.port, "/")
    assert code == 200
    assert b"<h1>queue-exporter</h1>" in page


def test_the_page_shows_control_characters_escaped(redis_client, redis_url, run_exporter):
    """Celery's separator and a queue name holding control bytes read as \\x06\\x16 on the
    page, as in check-config and the log, never as invisible characters."""
    queue = "celery\x06\x163"  # how kombu names priority step 3 of queue celery
    redis_client.rpush(f"jobs:{queue}", "a", "b")
    groups = [
        {"system": "app", "pattern": "jobs:{queue}", "type": "list", "state": "pending"},
        {"system": "app", "pattern": "sep\x06\x16{queue}", "type": "list", "state": "pending"},
    ]
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": groups}}})
    _status(app)
    page = _get(app.server.port, "/")[1].decode()
    assert "\x06" not in page and "\x16" not in page
    assert "celery\\x06\\x163" in page  # the queue, in the deepest queues
    assert "sep\\x06\\x16{queue}" in page  # the pattern, in the key groups and its warning
