"""Two replicas never serve sampled series at the same time (issue 23, attacks 12 and 21).

Two `queue-exporter serve` processes share a lease with a short TTL, each reaching the lease
through a TCP proxy of its own. Both are scraped all along, each by a thread of its own that
records when every scrape was sent and answered and whether it carried `queue_depth`. Two
scrapes, one of each replica, that both carried it and whose send-to-answer spans intersect
are an overlap: both replicas served at once. The leader is then, 20 times each:
- partitioned from the lease (its proxy cut) until the other serves, then healed;
- SIGSTOPped (once the kernel has stopped it, its scraper sends again) until the other serves,
  then SIGCONTed.
No overlap may occur, and a replica that serves must say `queue_exporter_leader 1`.
"""

from __future__ import annotations

import http.client
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import REDIS_HOST, REDIS_PORT, wait_for
from tests.private_redis import free_port
from tests.tcp_proxy import TcpProxy

RUNS = 20
KEY_GROUP = {"system": "app", "pattern": "jobs:{queue}", "type": "list", "state": "pending"}
LEADER = re.compile(rb"^queue_exporter_leader (\S+)$", re.MULTILINE)


@dataclass(frozen=True)
class Scrape:
    sent: float
    answered: float
    serving: bool  # carried queue_depth
    leader: float | None  # queue_exporter_leader


class Replica:
    """A serve process whose lease connection goes through its own proxy, scraped all along."""

    def __init__(self, directory: Path, name: str, redis_db: int) -> None:
        self.name = name
        self.port = free_port()
        self.proxy = TcpProxy(REDIS_HOST, REDIS_PORT).start()
        config = {
            "listen_address": f"127.0.0.1:{self.port}",
            "sample_interval": 0.2,
            "sources": {
                "redis": {
                    "url": f"redis://{REDIS_HOST}:{REDIS_PORT}/{redis_db}",
                    "key_groups": [KEY_GROUP],
                }
            },
            "leader_election": {
                "enabled": True,
                "lease_ttl": 0.8,
                "renew_interval": 0.2,
                "identity": name,
                "redis": {
                    "url": f"redis://127.0.0.1:{self.proxy.port}/{redis_db}",
                    "socket_timeout": 0.3,
                    "connect_timeout": 0.3,
                },
            },
        }
        config_file = directory / f"{name}.yaml"
        config_file.write_text(yaml.safe_dump(config))
        self.log_file = directory / f"{name}.log"
        with self.log_file.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "exporter", "serve", "--config", str(config_file)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.scrapes: list[Scrape] = []
        self.between_scrapes = threading.Lock()  # held by the scraper while a scrape is out
        self._stop = threading.Event()
        self._scraper = threading.Thread(target=self._scrape_all_along, daemon=True)

    def start_scraping(self) -> None:
        self._scraper.start()

    def serving(self) -> bool:
        """Whether its latest answered scrape carried queue_depth."""
        return bool(self.scrapes) and self.scrapes[-1].serving

    def answered_since(self, moment: float) -> Scrape | None:
        return next((s for s in reversed(self.scrapes) if s.sent > moment), None)

    def stop(self) -> None:
        self._stop.set()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
        self.process.wait(timeout=30)
        self._scraper.join(timeout=30)
        self.proxy.cut()

    def _scrape_all_along(self) -> None:
        while not self._stop.is_set():
            with self.between_scrapes:
                sent = time.monotonic()
                try:
                    body = _get(self.port)
                except OSError:
                    body = None
                answered = time.monotonic()
            if body is not None:
                match = LEADER.search(body)
                leader = float(match.group(1)) if match else None
                self.scrapes.append(Scrape(sent, answered, b"\nqueue_depth{" in body, leader))
            else:
                time.sleep(0.05)


def _get(port: int) -> bytes:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("GET", "/metrics")
        return connection.getresponse().read()
    finally:
        connection.close()


@pytest.fixture
def replicas(tmp_path: Path, redis_db: int, redis_client) -> Iterator[tuple[Replica, Replica]]:
    redis_client.rpush("jobs:emails", "a", "b")
    pair = (Replica(tmp_path, "one", redis_db), Replica(tmp_path, "two", redis_db))
    try:
        for replica in pair:
            wait_for(lambda r=replica: _up(r), timeout=30)
            replica.start_scraping()
        wait_for(lambda: any(replica.serving() for replica in pair), timeout=30)
        yield pair
    finally:
        for replica in pair:
            replica.stop()


def _up(replica: Replica) -> bool:
    if replica.process.poll() is not None:
        raise AssertionError(f"{replica.name} exited: {replica.log_file.read_text()[-2000:]}")
    try:
        _get(replica.port)
    except OSError:
        return False
    return True


def _leader_and_follower(pair: tuple[Replica, Replica]) -> tuple[Replica, Replica]:
    """The replica serving now (waited for), and the other."""
    wait_for(lambda: any(replica.serving() for replica in pair), timeout=30)
    first, second = pair
    return (first, second) if first.serving() else (second, first)


def _takes_over(replica: Replica, since: float) -> None:
    """Wait until a scrape of `replica` sent after `since` carries queue_depth."""

    def served() -> bool:
        scrape = replica.answered_since(since)
        return scrape is not None and replica.serving()

    wait_for(served, timeout=30, interval=0.02)


def _stops_serving(replica: Replica, since: float) -> None:
    def quiet() -> bool:
        scrape = replica.answered_since(since)
        return scrape is not None and not scrape.serving

    wait_for(quiet, timeout=30, interval=0.02)


def _wait_stopped(pid: int) -> None:
    """Wait until the kernel has stopped every thread of `pid`. A SIGSTOP takes effect when a
    thread of the process next runs, not when kill() returns: until then (milliseconds on a
    loaded host) the process goes on serving, and a scrape sent meanwhile may be checked
    against the lease before the stop and written after SIGCONT, a scrape in flight across
    the stop (its body holds what the lease allowed when checked: Telemetry.still_served)."""

    def stopped() -> bool:
        states = []
        for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
            try:
                states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:  # a thread that just ended
                continue
        return bool(states) and all(state in ("T", "t") for state in states)

    wait_for(stopped, timeout=30, interval=0.001)


def _overlaps(pair: tuple[Replica, Replica]) -> list[tuple[Scrape, Scrape]]:
    first, second = ([s for s in replica.scrapes if s.serving] for replica in pair)
    return [(a, b) for a in first for b in second if a.sent <= b.answered and b.sent <= a.answered]


def _check(pair: tuple[Replica, Replica], handovers: int) -> None:
    overlaps = _overlaps(pair)
    assert not overlaps, f"both replicas served at once {len(overlaps)} times: {overlaps[:3]}"
    for replica in pair:
        serving = [s for s in replica.scrapes if s.serving]
        assert serving, f"{replica.name} never served"
        wrong = [s for s in serving if s.leader != 1]
        assert not wrong, f"{replica.name} served while saying leader {wrong[0].leader}"
    assert handovers == RUNS


def test_a_partitioned_leader_stops_serving_before_the_other_starts(
    replicas: tuple[Replica, Replica],
) -> None:
    handovers = 0
    for _ in range(RUNS):
        leader, follower = _leader_and_follower(replicas)
        cut = time.monotonic()
        leader.proxy.cut()
        _takes_over(follower, cut)
        _stops_serving(leader, cut)
        handovers += 1
        leader.proxy.start()
    _check(replicas, handovers)


def test_a_stopped_leader_serves_nothing_after_it_resumes(
    replicas: tuple[Replica, Replica],
) -> None:
    handovers = 0
    for _ in range(RUNS):
        leader, follower = _leader_and_follower(replicas)
        with leader.between_scrapes:  # no scrape of it in flight: none answered across the stop
            leader.process.send_signal(signal.SIGSTOP)
            _wait_stopped(leader.process.pid)
        stopped = time.monotonic()
        _takes_over(follower, stopped)
        leader.process.send_signal(signal.SIGCONT)
        _stops_serving(leader, stopped)
        handovers += 1
    _check(replicas, handovers)
