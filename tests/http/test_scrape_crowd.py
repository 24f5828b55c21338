"""A crowd of scrapers never gets a healthy exporter's 503 (issue 40, attack 1).

50 scrapers (half asking for gzip), 20 scrapes each, all at once against one exporter while
events flow into its stream and its key sampler publishes, with and without leader election. Each render carries
the fences of the leases it was rendered under (exporter.output.exposition.Rendered): however many
renders are in flight, each body keeps its own right to be sent. Before, the right was kept
for the last 16 bodies by their id(): after about a hundred answers, scrapes got 503 "the
leader lease changed during every render" from an exporter whose lease never changed.
"""

from __future__ import annotations

import gzip
import http.client
import threading
import time

import pytest

from exporter.lifecycle.producer import EventEmitter
from tests.conftest import scrape_series, value, wait_for

SCRAPERS = 50
SCRAPES_EACH = 20
STREAM = "shop:events"
KEY_GROUP = {"system": "app", "pattern": "jobs:{queue}", "type": "list", "state": "pending"}
JOB = {"queue": "billing", "job_type": "invoice"}


def _scrapes(
    port: int, answers: list[tuple[int, bool]], start: threading.Barrier, gzipped: bool
) -> None:
    """SCRAPES_EACH scrapes on one connection: each answer's status, and whether it carried
    the sampled queue_depth."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Accept-Encoding": "gzip"} if gzipped else {}
    start.wait()
    try:
        for _ in range(SCRAPES_EACH):
            connection.request("GET", "/metrics", headers=headers)
            response = connection.getresponse()
            body = response.read()
            if response.getheader("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            answers.append((response.status, b"\nqueue_depth{" in body))
    finally:
        connection.close()


def _events(redis_url: str, stop: threading.Event) -> int:
    """Emit job events until `stop`; the number emitted."""
    emitted = 0
    with EventEmitter(redis_url, STREAM) as emitter:
        while not stop.is_set():
            emitter.emit("enqueued", **JOB, ts=time.time(), job_id=f"job-{emitted}")
            emitted += 1
            stop.wait(0.002)
    return emitted


@pytest.mark.parametrize("elected", [False, True], ids=["alone", "leader_election"])
def test_every_scrape_of_a_crowd_is_answered(elected, redis_client, redis_url, run_exporter):
    redis_client.rpush("jobs:emails", "a", "b")
    config: dict[str, object] = {
        "sources": {
            "redis": {"url": redis_url, "key_groups": [KEY_GROUP]},
            "events": {"streams": [{"key": STREAM, "system": "shop"}], "block_ms": 50},
        }
    }
    if elected:  # a lease long enough that it never changes hands during the test
        config["leader_election"] = {"enabled": True, "lease_ttl": 30, "renew_interval": 0.5}
    app = run_exporter(config)
    wait_for(lambda: value(scrape_series(app), "queue_depth", queue="emails") == 2)
    wait_for(lambda: app.health.snapshot()[f"events:{STREAM}"].up)

    stop = threading.Event()
    emitted: list[int] = []
    emitter = threading.Thread(target=lambda: emitted.append(_events(redis_url, stop)))
    emitter.start()
    answers: list[tuple[int, bool]] = []
    start = threading.Barrier(SCRAPERS)
    scrapers = [
        threading.Thread(target=_scrapes, args=(app.server.port, answers, start, index % 2 == 1))
        for index in range(SCRAPERS)  # half of them asking for gzip
    ]
    try:
        for scraper in scrapers:
            scraper.start()
        for scraper in scrapers:
            scraper.join(timeout=300)
    finally:
        stop.set()
        emitter.join(timeout=30)

    assert len(answers) == SCRAPERS * SCRAPES_EACH
    refused = [status for status, _ in answers if status != 200]
    assert not refused, f"{len(refused)} of {len(answers)} scrapes refused: {set(refused)}"
    assert all(sampled for _, sampled in answers)  # each carried the sampled series
    # The events flowed all along: the exporter consumed them while it was scraped.
    assert emitted and emitted[0] > 0
    wait_for(
        lambda: (
            value(scrape_series(app), "queue_exporter_events_total", stream=STREAM) == emitted[0]
        )
    )
