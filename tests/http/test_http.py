"""The HTTP endpoint: landing page, health, readiness, exposition formats."""

from __future__ import annotations

import gc
import gzip
import json
import urllib.error
import urllib.request

from exporter.config.settings import from_dict
from exporter.runtime.app import App
from tests.conftest import scrape, scrape_when, wait_for
from tests.private_redis import free_port


def _get(port: int, path: str, **headers: str):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_landing_health_and_unknown_paths(redis_url, run_exporter):
    app = run_exporter(redis_url=redis_url, preset=["orchestrata"])
    status, _, body = _get(app.server.port, "/")
    assert status == 200
    for link in (b'href="metrics"', b'href="healthz"', b'href="readyz"'):
        assert link in body
    assert _get(app.server.port, "/healthz")[0] == 200
    assert _get(app.server.port, "/nope")[0] == 404


def test_not_ready_until_every_source_answers(run_exporter):
    unreachable = f"redis://127.0.0.1:{free_port()}/0"
    app = run_exporter(redis_url=unreachable, preset=["orchestrata"])
    status, _, body = _get(app.server.port, "/readyz")
    assert status == 503
    assert json.loads(body)["ready"] is False
    assert _get(app.server.port, "/healthz")[0] == 200  # alive all the same


def test_listening_first_serves_own_metrics_and_is_not_ready_until_the_sources_are_built(
    redis_client, redis_url
):
    """serve's start-up: the listener answers before redis-py and the sources are loaded."""
    redis_client.rpush("orchestrata:dlq:billing", "{}")
    config = {"presets": ["orchestrata"], "sources": {"redis": {"url": redis_url}}}
    gc.disable()  # as serve's start-up runs (exporter/__main__.py)
    try:
        app = App(from_dict({**config, "listen_address": "127.0.0.1:0"}), listen_first=True)
        app.listen()
    finally:
        listening_with_gc = gc.isenabled()
        gc.enable()
    try:
        assert listening_with_gc  # on from the listener's start
        assert app.runners == []  # nothing built yet
        status, _, body = _get(app.server.port, "/readyz")
        assert (status, json.loads(body)["ready"]) == (503, False)
        metrics = scrape(app.server.port)
        assert "queue_exporter_build_info" in metrics
        assert "queue_depth" not in metrics  # nothing sampled is served before it is sampled
        assert "queue_exporter_http_auth_failures_total" not in metrics  # the SDK's, not yet
        app.start()
        assert len(app.runners) == 1
        assert "queue_exporter_http_auth_failures_total" in scrape(app.server.port)
        scrape_when(app, "queue_depth", queue="billing")
        assert wait_for(lambda: _get(app.server.port, "/readyz")[0] == 200)
    finally:
        app.shutdown()


def test_openmetrics_and_gzip(redis_client, redis_url, run_exporter):
    redis_client.rpush("orchestrata:dlq:billing", "{}")
    app = run_exporter(redis_url=redis_url, preset=["orchestrata"])
    scrape_when(app, "queue_depth", queue="billing")
    status, headers, body = _get(
        app.server.port, "/metrics", Accept="application/openmetrics-text; version=1.0.0"
    )
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")
    status, headers, body = _get(app.server.port, "/metrics", **{"Accept-Encoding": "gzip"})
    assert headers.get("Content-Encoding") == "gzip"
    assert b'queue_depth{system="orchestrata",queue="billing",priority=""' in gzip.decompress(body)
    assert "text/plain" in _get(app.server.port, "/metrics")[1]["Content-Type"]
    assert "queue_exporter_build_info" in scrape(app.server.port)
