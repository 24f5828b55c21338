"""Shared fixtures: a Redis database of the test's own, an exporter running in-process, scrapes."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from psycopg.conninfo import make_conninfo

from exporter.config import settings as config_module
from exporter.runtime.app import App
from tests import claims

# How the suite runs: xdist groups, CI's refusal of skips, the Hypothesis profiles; and the
# fast tier's guard (a test marked fast reaches no server).
pytest_plugins = ["tests.suite_rules", "tests.fast_tier"]

REDIS_HOST = os.environ.get("QE_TEST_REDIS_HOST", "127.0.0.1")
REDIS_PORT = int(os.environ.get("QE_TEST_REDIS_PORT", "6379"))


@pytest.fixture
def redis_db() -> Iterator[int]:
    """A database of the shared Redis of the test's own (tests/claims.py), flushed afterwards."""
    with claims.redis_database(REDIS_HOST, REDIS_PORT) as db:
        yield db


@pytest.fixture
def redis_client(redis_db: int) -> Iterator[redis.Redis]:
    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=redis_db)
    yield client
    client.close()


@pytest.fixture
def redis_url(redis_db: int) -> str:
    return f"redis://{REDIS_HOST}:{REDIS_PORT}/{redis_db}"


Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse_exposition(text: str) -> Series:
    series: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return series


def scrape(port: int, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        body: bytes = response.read()
    return body.decode()


def is_ready(port: int) -> bool:
    """/readyz says ready (200); False on its 503, any other answer fails."""
    try:
        return json.loads(scrape(port, "/readyz"))["ready"] is True
    except urllib.error.HTTPError as error:
        assert error.code == 503
        return False


def value(series: Series, name: str, **labels: str) -> float | None:
    """The value of the one series of `name` whose labels include `labels`; None if absent."""
    matches = [v for (n, ls), v in series.items() if n == name and set(labels.items()) <= set(ls)]
    if len(matches) > 1:
        raise AssertionError(f"{name}{labels} matches {len(matches)} series")
    return matches[0] if matches else None


def total(series: Series, name: str, **labels: str) -> float:
    """The sum of every series of `name` whose labels include `labels` (0 if none)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in series.items() if n == name and wanted <= set(ls))


def assert_runtimes_bucketed(
    series: Series,
    runtimes: list[float],
    within: float = 0.0,
    below: float = math.inf,
    **labels: str,
) -> None:
    """Each bucket of queue_job_execution_seconds with `labels` (summed over the other labels)
    whose bound is below `below` counts exactly the `runtimes` at most that bound, within
    `within` of it either way. The runtimes are the queue library's own (its job records, its
    worker's log): how long a job ran on a loaded host is the host's business, in which bucket
    the exporter puts it is the exporter's."""
    counted: dict[float, float] = {}
    for (name, found), number in series.items():
        if name == "queue_job_execution_seconds_bucket" and set(labels.items()) <= set(found):
            bound = float(dict(found)["le"])
            counted[bound] = counted.get(bound, 0.0) + number
    assert runtimes and counted, (labels, runtimes, counted)
    for bound, number in counted.items():
        if bound >= below:
            continue
        least = sum(seconds <= bound - within for seconds in runtimes)
        most = sum(seconds <= bound + within for seconds in runtimes)
        assert least <= number <= most, (labels, bound, number, sorted(runtimes))


def stop_process(process: subprocess.Popen[bytes], signum: int, timeout: float = 15) -> None:
    """Stop a process a test started with `signum` (its graceful stop), killing it past timeout."""
    if process.poll() is None:
        process.send_signal(signum)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (its children and theirs), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    pending = [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.add(child)
            pending.append(child)
    return found


# The sample interval (and each read's deadline) of tests whose native reader follows real
# workers: beside busy loops an RQ read took more than 1 s now and then, and a read cut off
# loses what only that read could see (workers age out of queue_workers after 2.5 intervals
# without a read). Celery's reads keep their events across a cut-off (test_native_celery.py).
REAL_WORKER_INTERVAL = 2.0


def wait_for(condition: Callable[[], Any], timeout: float = 60.0, interval: float = 0.1) -> Any:
    """Poll until condition() is truthy; its last value, or AssertionError at the deadline.

    The default deadline bounds a failing run and asserts no timing: what a test waits for (a
    real worker started, a reader's next read) can take many times its quiet-host time beside
    busy loops (scripts/load.sh), and a condition met returns at once anyway."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {result!r})")
        time.sleep(interval)


_T = TypeVar("_T")


def measured_within(
    measure: Callable[[], _T], within: Callable[[_T], bool], tries: int = 3
) -> list[_T]:
    """Up to `tries` measurements of a timing property, until one is `within` its bound: those
    taken (AssertionError naming them all when none is). On a loaded host a burst of the other
    tests' can land on one measurement; a real regression shows in every one."""
    taken: list[_T] = []
    for _ in range(tries):
        taken.append(measure())
        if within(taken[-1]):
            return taken
    raise AssertionError(f"not within the bound in {tries} measurements: {taken}")


@pytest.fixture
def run_exporter() -> Iterator[Callable[..., App]]:
    """Start an exporter in-process on a free port from a config dict; stopped after the test."""
    apps: list[App] = []

    def start(raw: dict[str, Any] | None = None, **overrides: Any) -> App:
        raw = dict(raw or {})
        raw.setdefault("listen_address", "127.0.0.1:0")
        # every source's cycle deadline too: 0.2 s timed out cycles of real-worker tests on two
        # busy cores (CI, four xdist workers), 0.5 s leaves them room
        raw.setdefault("sample_interval", 0.5)
        config = config_module.from_dict(_with_overrides(raw, overrides))
        app = App(config)
        app.start()
        apps.append(app)
        return app

    yield start
    for app in apps:
        app.shutdown()


def _with_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    for name, setting in overrides.items():
        config_module.set_path(raw, config_module.OVERRIDE_PATHS[name], setting)
    return raw


def scrape_series(app: App) -> Series:
    return parse_exposition(scrape(app.server.port))


def scrape_when(app: App, name: str, **labels: str) -> Series:
    """Scrape until the series `name` with `labels` is present; that scrape."""

    def present() -> Series | None:
        series = scrape_series(app)
        wanted = set(labels.items())
        found = any(n == name and wanted <= set(ls) for n, ls in series)
        return series if found else None

    result: Series = wait_for(present)
    return result


def wait_until_served_as_truth(
    app: App, mismatches: Callable[[Series, float], list[str]], timeout: float = 20.0
) -> None:
    """Scrape until `mismatches(series, scraped_at)` (time.time() at the scrape: ages are
    served between a library's truth and then) finds no difference between what is served and
    what the real library says; at the deadline, fail listing the last differences."""
    found: list[str] = []

    def agrees() -> bool:
        scraped_at = time.time()
        found[:] = mismatches(scrape_series(app), scraped_at)
        return not found

    try:
        wait_for(agrees, timeout=timeout, interval=0.3)
    except AssertionError:
        raise AssertionError("\n".join(found)) from None


POSTGRES_ADMIN_DSN = os.environ.get(
    "QE_TEST_POSTGRES_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
)


_dead_databases_dropped: list[bool] = []


@pytest.fixture
def postgres_dsn() -> Iterator[str]:
    """A fresh database of the test's own (named after its process: tests/claims.py), dropped
    afterwards; the first one a process makes drops those of processes no longer alive."""
    name = claims.postgres_database_name()
    with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as admin:
        if not _dead_databases_dropped:
            claims.drop_dead_databases(admin)
            _dead_databases_dropped.append(True)
        admin.execute(f'CREATE DATABASE "{name}"')
    yield make_conninfo(POSTGRES_ADMIN_DSN, dbname=name)
    with psycopg.connect(POSTGRES_ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class ServeProcess:
    """`queue-exporter serve` as a real process on a free port; killed at teardown if alive."""

    def __init__(self, *args: str) -> None:
        from tests.private_redis import free_port

        self.port = free_port()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "exporter",
                "serve",
                *args,
                "--listen-address",
                f"127.0.0.1:{self.port}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def series_when(self, condition: Callable[[Series], Any], timeout: float = 30) -> Series:
        """Scrape until condition(series) holds (the process may still be starting)."""

        def scraped() -> Series | None:
            try:
                series = parse_exposition(scrape(self.port))
            except OSError:
                return None
            return series if condition(series) else None

        result: Series = wait_for(scraped, timeout=timeout)
        return result

    def sigterm(self) -> tuple[float, str]:
        """SIGTERM, then the exit: the seconds it took and stderr; an exit other than 0 fails."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        _, stderr = self.process.communicate(timeout=30)
        stopped_in = time.monotonic() - started
        assert self.process.returncode == 0, stderr[-2000:]
        return stopped_in, stderr

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


@pytest.fixture
def serve_process() -> Iterator[Callable[..., ServeProcess]]:
    started: list[ServeProcess] = []

    def start(*args: str) -> ServeProcess:
        started.append(ServeProcess(*args))
        return started[-1]

    yield start
    for process in started:
        process.stop()
