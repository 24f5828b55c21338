"""Attacks on the HTTP front door, against a real `queue-exporter serve` over real sockets.

Each test measures its baseline in the same run (ratios, never absolute times): the figures
they print are the ones in docs/security.md (run with -s to see them).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import random
import socket
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from exporter.health import HealthBoard
from exporter.http_server import SCRAPE_THREADS, HttpConfig, MetricsServer, Render
from tests.conftest import ServeProcess, wait_for

QUEUES = 50  # x 3 priorities: a scrape renders a few hundred series
SLOW_SOCKETS = 500
SCRAPERS = 50
SCRAPES_EACH = 3
SCRAPE_PERIOD = 3.0  # seconds between one scraper's scrapes (Prometheus: a scrape interval)
REQUEST_TIMEOUT = 10.0  # the default: longer than a round, so the slow sockets last it
ROUNDS = 3  # a noisy neighbour may spoil a round; pinned workers would spoil them all


def serve_with(serve_process: Any, tmp_path: Path, **config: Any) -> ServeProcess:
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    process: ServeProcess = serve_process("--config", str(path))
    return process


def timed_get(port: int, path: str = "/metrics", timeout: float = 30.0) -> tuple[int, float]:
    """(status, seconds) of one GET on a new connection, as a scraper makes it."""
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path, headers={"Accept-Encoding": "gzip"})
        response = connection.getresponse()
        response.read()
        return response.status, time.perf_counter() - started
    finally:
        connection.close()


async def async_get(port: int, path: str = "/metrics") -> tuple[int, float]:
    """timed_get on the test's event loop: one thread for every client, so the clients' own
    threads do not add to the times they measure."""
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        request = f"GET {path} HTTP/1.1\r\nHost: exporter\r\nAccept-Encoding: gzip\r\n"
        writer.write(request.encode() + b"Connection: close\r\n\r\n")
        response = await asyncio.wait_for(reader.read(), 30)  # until the server closes
        return int(response.split(b" ", 2)[1]), time.perf_counter() - started
    finally:
        writer.close()


def slow_sockets(port: int, count: int) -> list[socket.socket]:
    """Connections that send half a request and then nothing (slowloris)."""
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: exporter\r\nX-Slow: ")
        sockets.append(sock)
    return sockets


def is_cut(sock: socket.socket) -> bool:
    sock.settimeout(0.01)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:  # reset
        return True


def seed_queues(client: redis.Redis) -> None:
    item = json.dumps({"queued_at": "2026-01-01T00:00:00Z"})
    with client.pipeline(transaction=False) as pipe:
        for queue in range(QUEUES):
            for priority in range(3):
                pipe.rpush(f"orchestrata:queue:q{queue}:p{priority}", item)
        pipe.execute()


def idle_scrapes(port: int, count: int) -> list[float]:
    """Seconds of `count` scrapes one after the other, by the same client as the scrapers'."""

    async def scrapes() -> list[float]:
        return [(await async_get(port))[1] for _ in range(count)]

    return asyncio.run(scrapes())


def scrape_round(port: int) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """SCRAPERS scrapers, each scraping SCRAPES_EACH times every SCRAPE_PERIOD seconds, and a
    prober of /healthz meanwhile: (scrapes, probes)."""

    async def scraper() -> list[tuple[int, float]]:
        await asyncio.sleep(random.uniform(0, SCRAPE_PERIOD))  # scrapers are not in phase
        results = []
        for number in range(SCRAPES_EACH):
            if number:
                await asyncio.sleep(max(SCRAPE_PERIOD - results[-1][1], 0))
            results.append(await async_get(port))
        return results

    async def prober() -> list[tuple[int, float]]:
        results = []
        for _ in range(SCRAPES_EACH * 4):
            await asyncio.sleep(SCRAPE_PERIOD / 4)
            results.append(await async_get(port, "/healthz"))
        return results

    async def both() -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
        probing = asyncio.create_task(prober())
        scrapes = await asyncio.gather(*(scraper() for _ in range(SCRAPERS)))
        return [result for each in scrapes for result in each], await probing

    return asyncio.run(both())


def all_cut(sockets: list[socket.socket]) -> bool:
    return all(is_cut(sock) for sock in sockets)


def p99(results: list[tuple[int, float]]) -> float:
    latencies = sorted(seconds for _, seconds in results)
    return latencies[int(len(latencies) * 0.99) - 1]


def test_slow_clients_pin_nothing_and_scrapes_stay_fast(
    serve_process, tmp_path, redis_url, redis_client
):
    seed_queues(redis_client)
    exporter = serve_with(
        serve_process, tmp_path, presets=["orchestrata"], sources={"redis": {"url": redis_url}}
    )
    exporter.series_when(
        lambda series: sum(n == "queue_depth" for n, _ in series) >= QUEUES * 3, timeout=60
    )
    idle_scrapes(exporter.port, 5)  # warm-up
    for round_number in range(1, ROUNDS + 1):
        # Baselines measured right before each round: the machine's noise changes by the minute.
        idle_median = statistics.median(idle_scrapes(exporter.port, 30))
        unattacked, _ = scrape_round(exporter.port)
        attackers = slow_sockets(exporter.port, SLOW_SOCKETS)
        opened = time.monotonic()
        timed_get(exporter.port, "/healthz")  # the server has taken them all in
        attacked, health = scrape_round(exporter.port)
        assert time.monotonic() - opened < REQUEST_TIMEOUT  # the attack lasted the round
        print(
            f"\nround {round_number}: idle scrape median {idle_median * 1000:.1f} ms; "
            f"{SCRAPERS} scrapers: p99 {p99(unattacked) * 1000:.1f} ms; with {SLOW_SOCKETS} slow "
            f"sockets: p99 {p99(attacked) * 1000:.1f} ms ({p99(attacked) / idle_median:.1f}x the "
            f"idle median, {p99(attacked) / p99(unattacked):.2f}x unattacked), "
            f"/healthz {max(s for _, s in health) * 1000:.1f} ms at most"
        )
        assert len(attacked) == SCRAPERS * SCRAPES_EACH
        assert {status for status, _ in attacked} == {200}  # every scrape succeeded
        assert {status for status, _ in health} == {200}
        # The slow sockets are cut once their request deadline has passed.
        wait_for(lambda: all_cut(attackers), timeout=REQUEST_TIMEOUT * 3)  # noqa: B023
        for sock in attackers:
            sock.close()
        if p99(attacked) <= 3 * p99(unattacked):
            return
    raise AssertionError(f"slow sockets tripled the p99 of scrapes in all {ROUNDS} rounds")


@pytest.fixture
def front_door():
    """A MetricsServer in-process with a render of the test's own; stopped after the test."""
    servers: list[MetricsServer] = []

    def start(render: Render, **settings: Any) -> MetricsServer:
        server = MetricsServer("127.0.0.1", 0, render, HealthBoard(), None, HttpConfig(**settings))
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def test_health_answers_while_every_scrape_thread_is_busy(front_door):
    release = threading.Event()

    def stuck_render(_: bool) -> bytes:
        release.wait(30)
        return b"# EOF\n"

    server = front_door(stuck_render)
    scrapes = [
        threading.Thread(target=timed_get, args=(server.port,)) for _ in range(SCRAPE_THREADS + 3)
    ]
    for scrape in scrapes:
        scrape.start()
    try:
        wait_for(lambda: all(scrape.is_alive() for scrape in scrapes))
        for path in ("/healthz", "/readyz"):
            status, _ = timed_get(server.port, path, timeout=5)
            assert status == 200
        assert all(scrape.is_alive() for scrape in scrapes)  # still held: health did not wait
    finally:
        release.set()
        for scrape in scrapes:
            scrape.join()


def test_connections_beyond_the_bound_are_closed_on_arrival(front_door):
    server = front_door(lambda _: b"", max_connections=20)
    held = slow_sockets(server.port, 20)
    wait_for(lambda: is_cut(socket.create_connection(("127.0.0.1", server.port))))
    for sock in held[:5]:
        sock.close()
    status, _ = wait_for(lambda: _status_or_none(server.port))
    assert status == 200
    for sock in held[5:]:
        sock.close()


def _status_or_none(port: int) -> tuple[int, float] | None:
    try:
        return timed_get(port, "/healthz", timeout=5)
    except (OSError, http.client.HTTPException):
        return None
