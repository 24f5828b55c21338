"""The HTTP endpoint under resource exhaustion, heavy polling and signals (issue 23, attacks 16,
18, 19, 20), against `queue-exporter serve` processes on real sockets.

- Out of file descriptors (`ulimit -n 64`, 80 idle connections): the accept loop backs off
  instead of spinning on EMFILE, says so once, and serves again once descriptors free up.
- 8 clients polling /status.json in a loop beside 50k series slow /metrics by at most 1.5x
  (median scrape time with and without them, measured in this test).
- SIGHUP is ignored with a log line; SIGTERM ends serve whichever thread it reaches;
  `Accept-Encoding: gzip;q=0` gets no gzip.
"""

from __future__ import annotations

import ctypes
import http.client
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REDIS_HOST, REDIS_PORT, measured_within, wait_for
from tests.private_redis import free_port

KEY_GROUP = {"system": "app", "pattern": "jobs:{queue}", "type": "list", "state": "pending"}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class Serve:
    """A `queue-exporter serve` process on a free port, its log in a file."""

    def __init__(self, directory: Path, config: dict[str, Any], fd_limit: int | None = None):
        self.port = free_port()
        config = {**config, "listen_address": f"127.0.0.1:{self.port}"}
        config_file = directory / "serve.yaml"
        config_file.write_text(yaml.safe_dump(config))
        self.log_file = directory / "serve.log"

        def limit() -> None:
            if fd_limit is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

        with self.log_file.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "exporter", "serve", "--config", str(config_file)],
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=limit,
            )

    def get(self, path: str = "/metrics", **headers: str) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()

    def wait_serving(self, needle: bytes = b"queue_exporter_source_up") -> None:
        def serving() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"serve exited: {self.log()[-2000:]}")
            try:
                return needle in self.get()[2]
            except OSError:
                return False

        wait_for(serving, timeout=60)

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Any]:
    started: list[Serve] = []

    def start(config: dict[str, Any], fd_limit: int | None = None) -> Serve:
        started.append(Serve(tmp_path, config, fd_limit))
        return started[-1]

    yield start
    for process in started:
        process.stop()


def _sources(redis_db: int, interval: float = 1.0) -> dict[str, Any]:
    url = f"redis://{REDIS_HOST}:{REDIS_PORT}/{redis_db}"
    return {
        "sample_interval": interval,
        "sources": {"redis": {"url": url, "key_groups": [KEY_GROUP]}},
    }


ACCEPT_REFUSED = "cannot accept connections (Too many open files)"


def test_out_of_descriptors_the_server_backs_off_and_recovers(serve, redis_db, redis_client):
    redis_client.rpush("jobs:emails", "a")
    config = {**_sources(redis_db), "http": {"request_timeout": 120}}
    exporter = serve(config, fd_limit=64)
    exporter.wait_serving()
    idle: list[socket.socket] = []
    try:
        for _ in range(80):  # beyond the limit: the rest wait in the listen backlog
            idle.append(socket.create_connection(("127.0.0.1", exporter.port), timeout=5))
        # The server's EMFILE (a source's connection cut off under load may meet it too, and
        # says so in its own line: not what is counted here)
        wait_for(lambda: ACCEPT_REFUSED in exporter.log(), timeout=30)
        log_before, cpu_before, wall_before = (
            len(exporter.log()),
            exporter.cpu_seconds(),
            time.monotonic(),
        )
        time.sleep(3)
        cpu = exporter.cpu_seconds() - cpu_before
        wall = time.monotonic() - wall_before
        grown = exporter.log()[log_before:]
        print(f"out of descriptors: {cpu:.2f} s CPU in {wall:.2f} s, log +{len(grown)} chars")
        # A loop spinning on EMFILE takes a whole core: backing off takes a small part of one.
        assert cpu < 0.25 * wall, f"{cpu:.2f} s of CPU in {wall:.2f} s while out of descriptors"
        assert ACCEPT_REFUSED not in grown  # logged once per minute, not per try
        assert "Traceback" not in exporter.log()
    finally:
        for sock in idle:
            sock.close()
    assert exporter.log().count(ACCEPT_REFUSED) == 1
    wait_for(lambda: exporter.get()[0] == 200, timeout=30)  # descriptors free: served again


def test_sighup_is_ignored_with_a_log_line(serve, redis_db, redis_client):
    redis_client.rpush("jobs:emails", "a")
    exporter = serve(_sources(redis_db))
    exporter.wait_serving()
    exporter.process.send_signal(signal.SIGHUP)
    wait_for(lambda: "received SIGHUP: ignored" in exporter.log())
    assert exporter.process.poll() is None
    assert exporter.get()[0] == 200


def test_sighup_during_start_up_ends_nothing(serve, redis_db, redis_client):
    """From the entry point's first line SIGHUP is ignored (the SigIgn mask of /proc), and
    SIGHUPs sent all through the rest of start-up, until serve's own handler logs one, end
    nothing."""
    redis_client.rpush("jobs:emails", "a")
    exporter = serve(_sources(redis_db))
    hup = 1 << (signal.SIGHUP - 1)

    def ignored() -> bool:
        status = Path(f"/proc/{exporter.process.pid}/status").read_text()
        mask = next(line for line in status.splitlines() if line.startswith("SigIgn:"))
        return bool(int(mask.split()[1], 16) & hup)

    wait_for(ignored, timeout=30, interval=0.001)

    def hung_up_until_logged() -> bool:
        if exporter.process.poll() is not None:
            raise AssertionError(f"serve exited on SIGHUP: {exporter.log()[-2000:]}")
        exporter.process.send_signal(signal.SIGHUP)
        return "received SIGHUP: ignored" in exporter.log()

    wait_for(hung_up_until_logged, timeout=60, interval=0.005)
    exporter.wait_serving()


def test_sigterm_handed_to_any_thread_ends_serve(serve, redis_db, redis_client):
    """A process-directed signal may run its handler on any thread; Python acts on it only in
    the main thread, when that thread next runs. SIGTERM sent to one of serve's other threads
    (tgkill) ends it as SIGTERM to the process does (a main thread parked in one untimed wait
    never saw it)."""
    redis_client.rpush("jobs:emails", "a")
    exporter = serve(_sources(redis_db))
    exporter.wait_serving()
    pid = exporter.process.pid
    threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != pid]
    assert threads  # the samplers' and the HTTP server's
    tgkill = ctypes.CDLL(None, use_errno=True).tgkill
    assert tgkill(pid, threads[-1], signal.SIGTERM) == 0, os.strerror(ctypes.get_errno())
    try:
        assert exporter.process.wait(timeout=30) == 0
    except subprocess.TimeoutExpired:
        raise AssertionError(f"serve went on after SIGTERM: {exporter.log()[-2000:]}") from None
    assert "received SIGTERM, shutting down" in exporter.log()


@pytest.mark.parametrize(
    ("accept_encoding", "gzipped"),
    [
        ("gzip", True),
        ("gzip;q=0, identity", False),
        ("gzip; q=0.000", False),
        ("identity, *;q=0", False),
        ("*", True),
        ("br;q=1, gzip;q=0.5", True),
        ("gzip;q=nonsense", False),
        ("x-gzip", True),
        ("deflate", False),
    ],
)
def test_accept_encoding_q_values_are_honoured(accept_encoding, gzipped, redis_url, run_exporter):
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [KEY_GROUP]}}})
    connection = http.client.HTTPConnection("127.0.0.1", app.server.port, timeout=10)
    connection.request("GET", "/metrics", headers={"Accept-Encoding": accept_encoding})
    response = connection.getresponse()
    body = response.read()
    connection.close()
    assert response.status == 200
    assert (response.getheader("Content-Encoding") == "gzip") is gzipped
    assert body.startswith(b"\x1f\x8b") is gzipped


def test_status_page_polling_does_not_slow_metrics(serve, redis_db, redis_client):
    keys = 50_000
    pipeline = redis_client.pipeline(transaction=False)
    for index in range(keys):
        pipeline.rpush(f"jobs:q{index}", "x")
    pipeline.execute()
    config = {**_sources(redis_db, interval=300), "limits": {"max_series_per_metric": 100_000}}
    exporter = serve(config)
    exporter.wait_serving(needle=b'queue="q49999"')
    assert exporter.get("/status.json")[0] == 200

    def scrape_times(rounds: int) -> list[float]:
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            status, _, body = exporter.get()
            times.append(time.perf_counter() - started)
            assert status == 200 and b'queue="q49999"' in body
        return times

    done, polling = threading.Event(), threading.Event()
    polled = [0] * 8

    def poll(index: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=60)
        while not done.is_set():
            polling.wait()
            connection.request("GET", "/status.json")
            response = connection.getresponse()
            response.read()
            polled[index] += response.status == 200

    pollers = [threading.Thread(target=poll, args=(i,), daemon=True) for i in range(8)]
    for poller in pollers:
        poller.start()

    def slowdown() -> float:
        quiet: list[float] = []
        busy: list[float] = []
        # Short phases, many times over: the machine's load, shared with other work, changes
        # within seconds, and must hit both sides alike.
        for _ in range(8):
            quiet += scrape_times(6)
            polling.set()
            time.sleep(0.2)
            busy += scrape_times(6)
            polling.clear()
            time.sleep(0.2)
        ratio = statistics.median(busy) / statistics.median(quiet)
        print(
            f"/metrics p50 {statistics.median(quiet) * 1000:.0f} ms quiet, "
            f"{statistics.median(busy) * 1000:.0f} ms with 8 pollers: ratio {ratio:.2f}"
        )
        return ratio

    # The other tests' bursts can land on the busy phases of one measurement (CI saw 1.65 once).
    try:
        measured_within(slowdown, lambda ratio: ratio <= 1.5)
    finally:
        done.set()
        polling.set()
        for poller in pollers:
            poller.join(timeout=60)
    assert all(polled), polled  # every poller was answered
