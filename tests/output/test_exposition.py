"""The one metrics core: the store rendered as Prometheus text and OpenMetrics.

Escaping is fuzzed (any unicode, quotes, backslashes, newlines in label values; any float),
outputs are read back with prometheus_client's two parsers and checked by promtool, a scrape
is bounded by the cap, and concurrent scrapes share one render.
"""

from __future__ import annotations

import math
import platform
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_text

from exporter import __version__
from exporter.lifecycle.metrics import EventMetrics, Heartbeat, Tally
from exporter.output import exposition
from exporter.output.catalog import BY_NAME
from exporter.output.exposition import Rendered
from exporter.output.health import HealthBoard
from exporter.output.samples import SampleSet, Series
from exporter.output.store import OVERFLOW, Family, NumberFamily
from exporter.output.telemetry import SharedRender, Telemetry
from exporter.output.telemetry_config import LimitsConfig
from tests.conftest import scrape, scrape_when, wait_for
from tests.threads import waits_at
from tests.tools import run

DEPTH = BY_NAME["queue_depth"]
JOB = ("app", "q", "t", "")
label_text = st.text(max_size=30)  # every code point but lone surrogates


def _samples(text: str, openmetrics: bool) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """name and sorted labels -> value, as prometheus_client's parser reads the exposition."""
    parse = parse_openmetrics if openmetrics else parse_text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in parse(text)
        for sample in family.samples
    }


def _same(expected: float, parsed: float) -> bool:
    return (math.isnan(expected) and math.isnan(parsed)) or expected == parsed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    series=st.dictionaries(
        st.tuples(label_text, label_text, label_text, label_text),
        st.floats(allow_nan=True, allow_infinity=True),
        max_size=20,
    ),
    job_types=st.lists(label_text, max_size=5, unique=True),
    durations=st.lists(st.floats(min_value=0, max_value=1e6), min_size=1, max_size=5),
)
def test_any_label_value_and_any_value_read_back_exactly(series, job_types, durations):
    telemetry = Telemetry(HealthBoard())
    samples = SampleSet()
    for labels, value in series.items():
        samples.add_labelled(DEPTH, labels, value)
    telemetry.publish("redis", samples)
    tally = Tally()
    for job_type in job_types:
        tally.count("queue_jobs_failed_total", ("app", "q", job_type, "", "timeout"), 2)
        for duration in durations:
            tally.observe("queue_job_execution_seconds", ("app", "q", job_type, ""), duration)
    telemetry.store.apply(tally.counts, tally.observations)

    for openmetrics in (False, True):
        read = _samples(telemetry.render(openmetrics).decode(), openmetrics)
        for labels, value in series.items():
            key = ("queue_depth", tuple(sorted(zip(DEPTH.labels, labels, strict=True))))
            assert _same(value, read[key]), (labels, value, read.get(key))
        for job_type in job_types:
            failed = {"system": "app", "queue": "q", "job_type": job_type}
            failed |= {"priority": "", "error_type": "timeout"}
            assert read[("queue_jobs_failed_total", tuple(sorted(failed.items())))] == 2
            job = {"system": "app", "queue": "q", "job_type": job_type, "priority": ""}
            count = read[("queue_job_execution_seconds_count", tuple(sorted(job.items())))]
            assert count == len(durations)
            infinite = tuple(sorted({**job, "le": "+Inf"}.items()))
            assert read[("queue_job_execution_seconds_bucket", infinite)] == len(durations)
    telemetry.shutdown()


@pytest.mark.fast
def test_every_family_passes_promtool_and_both_parsers():
    telemetry = Telemetry(HealthBoard())
    metrics = EventMetrics(telemetry, {})
    samples = SampleSet()
    for queue in ('say "hi"', "back\\slash", "new\nline", "ünïcødé 队列 🚀", ""):
        samples.add_labelled(DEPTH, ("app", queue, "1", "pending"), 3)
        samples.add_labelled(BY_NAME["queue_jobs_enqueued_total"], ("app", queue, "", ""), 7)
    telemetry.publish("redis", samples)
    tally = Tally()
    tally.count("queue_jobs_enqueued_total", JOB, 2)
    tally.observe("queue_job_execution_seconds", JOB, 0.3)
    tally.heartbeats.append(Heartbeat("app", "q", "w1", 1, 4, time.time()))
    metrics.record("jobs:events", tally, metrics.worker_registry(60.0, 100))
    telemetry.count_error("redis", "timeout")

    text = telemetry.render(False).decode()
    checked = run("promtool", "check", "metrics", stdin=text)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    read = _samples(text, False)
    openmetrics = telemetry.render(True).decode()
    assert openmetrics.endswith("# EOF\n") and openmetrics.count("# EOF") == 1
    assert _samples(openmetrics, True).keys() >= read.keys() - {
        key for key in read if key[0].endswith("_created")
    }
    # Attune's sampled totals and the event counters are one family: one HELP, one TYPE.
    assert text.count("# TYPE queue_jobs_enqueued_total counter") == 1
    enqueued = [key for key in read if key[0] == "queue_jobs_enqueued_total"]
    assert len(enqueued) == 6
    for name in ("queue_workers", "queue_worker_slots", "queue_worker_utilization_ratio"):
        assert any(key[0] == name for key in read), name
    assert any(key[0] == "queue_exporter_source_errors_total" for key in read)
    telemetry.shutdown()


@pytest.mark.fast
def test_the_media_types_name_the_formats_prometheus_client_writes():
    """The self-metrics are written by prometheus_client: the header names its formats."""
    from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
    from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST

    assert exposition.content_type(False) == CONTENT_TYPE_PLAIN_0_0_4
    assert exposition.content_type(True) == CONTENT_TYPE_LATEST


@pytest.mark.fast
def test_line_starts_are_kept_for_the_series_still_served_and_written_as_new():
    """A render keeps each series' line start for the next (exposition.LineStarts): a kept
    start, escaped or not, is written as a first render writes it, and the starts of label
    sets or families no longer served are let go."""

    def depths(*queues: str) -> list[Family]:
        series = Series(({("app", queue, "1", "pending"): 2.5 for queue in queues},))
        return [NumberFamily(DEPTH, series)]

    starts = exposition.LineStarts()
    for queues in (('say "hi"', "a"), ('say "hi"', "b"), ("b", "c\\")):
        for openmetrics in (False, True):
            kept = exposition.render(depths(*queues), openmetrics, starts)
            assert kept == exposition.render(depths(*queues), openmetrics, exposition.LineStarts())
        [by_labels] = starts.by_format.values()
        assert [labels[1] for labels in by_labels] == list(queues)
    exposition.render([], False, starts)
    assert starts.by_format == {}


@pytest.mark.fast
def test_before_the_self_metrics_are_built_the_build_alone_is_served_and_logins_wait():
    """serve's first answers (self_metrics_later): queue_exporter_build_info, the same series
    the SDK serves after; a login refused meanwhile is counted once the SDK is up."""
    telemetry = Telemetry(HealthBoard(), self_metrics_later=True)
    telemetry.count_auth_failure("unknown_user")
    early = telemetry.render(False).decode()
    checked = run("promtool", "check", "metrics", stdin=early)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    build = (
        "queue_exporter_build_info",
        (("python", platform.python_version()), ("version", __version__)),
    )
    assert _samples(early, False) == {build: 1.0}
    assert _samples(telemetry.render(True).decode(), True) == {build: 1.0}

    telemetry.build_self_metrics()
    built = _samples(telemetry.render(False).decode(), False)
    assert built[build] == 1.0
    assert built[("queue_exporter_http_auth_failures_total", (("reason", "unknown_user"),))] == 1
    assert built[("queue_exporter_http_auth_failures_total", (("reason", "missing"),))] == 0
    telemetry.shutdown()


@pytest.mark.fast
def test_a_scrape_is_bounded_by_the_cap_whatever_floods_in():
    cap = 200
    telemetry = Telemetry(HealthBoard(), LimitsConfig(max_series_per_metric=cap))
    metrics = EventMetrics(telemetry, {})
    workers = metrics.worker_registry(60.0, 100_000)
    samples = SampleSet()
    for n in range(5000):
        samples.add_labelled(DEPTH, ("app", f"queue-{n}", "", "pending"), 1)
    # A family fed twice: totals a system keeps itself (Attune's) and event counters.
    totals = SampleSet()
    for n in range(5000):
        totals.add_labelled(BY_NAME["queue_jobs_completed_total"], ("attune", f"a{n}", "", ""), 1)
    telemetry.publish("redis", samples)
    telemetry.publish("postgres", totals)
    now = time.time()
    for batch in range(5):
        tally = Tally()
        for n in range(2000):
            job = ("app", "q", f"type-{batch}-{n}", "")
            tally.count("queue_jobs_completed_total", job)
            tally.observe("queue_job_execution_seconds", job, 0.1)
            tally.heartbeats.append(Heartbeat("app", f"queue-{batch}-{n}", "w", 1, 2, now))
        metrics.record("jobs:events", tally, workers)
    telemetry.publish("postgres", totals)  # again, now that the events took their share

    read = _samples(telemetry.render(False).decode(), False)
    per_family: dict[str, int] = {}
    for name, _ in read:
        family = name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
        per_family[family] = per_family.get(family, 0) + 1
    for family in (
        "queue_depth",
        "queue_jobs_completed_total",
        "queue_job_execution_seconds",
        "queue_workers",
        "queue_worker_slots",
        "queue_worker_utilization_ratio",
    ):
        assert 0 < per_family[family] <= cap, (family, per_family[family])
    overflow = {
        dict(labels)["metric"]: value
        for (name, labels), value in read.items()
        if name == "queue_exporter_series_overflow_total"
    }
    assert overflow["queue_depth"] == 5000 - (cap - 1)
    assert overflow["queue_job_execution_seconds"] > 0
    # Every heartbeat of a queue without room is refused and counted.
    admitted = per_family["queue_workers"] // 2
    assert overflow["queue_workers"] == 10_000 - admitted
    assert any(name == "queue_depth" and dict(labels)["queue"] == OVERFLOW for name, labels in read)
    telemetry.shutdown()


@pytest.mark.fast
def test_worker_room_is_freed_when_a_queues_workers_are_gone():
    telemetry = Telemetry(HealthBoard(), LimitsConfig(max_series_per_metric=6))
    metrics = EventMetrics(telemetry, {})
    workers = metrics.worker_registry(timeout=60.0, max_workers=100)
    now = time.time()
    tally = Tally()
    for queue in ("a", "b", "c"):  # room for three queues: 6 samples, 2 per queue
        tally.heartbeats.append(Heartbeat("app", queue, "w", 0, 1, now - 120))
    tally.heartbeats.append(Heartbeat("app", "d", "w", 0, 1, now))  # refused: no room
    metrics.record("s", tally, workers)
    first = _samples(telemetry.render(False).decode(), False)
    assert {dict(labels)["queue"] for name, labels in first if name == "queue_workers"} == set()
    tally = Tally()
    tally.heartbeats.append(Heartbeat("app", "e", "w", 0, 1, now))
    metrics.record("s", tally, workers)  # a, b and c timed out: their room went back
    second = _samples(telemetry.render(False).decode(), False)
    assert {dict(labels)["queue"] for name, labels in second if name == "queue_workers"} == {"e"}
    telemetry.shutdown()


@pytest.mark.fast
def test_concurrent_scrapes_share_the_render_in_progress():
    calls: list[int] = []
    release = threading.Event()

    def slow_render() -> Rendered:
        calls.append(1)
        release.wait(timeout=30)
        return Rendered(f"render {len(calls)}".encode())

    shared = SharedRender(slow_render)
    bodies: list[bytes] = []
    first = threading.Thread(target=lambda: bodies.append(shared().body))
    first.start()
    wait_for(lambda: calls)  # the first render is in progress
    waiting = [threading.Thread(target=lambda: bodies.append(shared().body)) for _ in range(3)]
    for thread in waiting:
        thread.start()
    # Each has arrived (a late one would render again, and fail below): it waits for the lock.
    wait_for(lambda: all(waits_at(t, SharedRender.__call__, "with self._lock:") for t in waiting))
    release.set()
    for thread in (first, *waiting):
        thread.join(timeout=30)
    assert bodies == [b"render 1"] * 4
    assert len(calls) == 1
    assert shared().body == b"render 2"  # a scrape after the render finished gets a fresh one


def test_real_redis_keys_with_hostile_names_scrape_cleanly(redis_client, redis_url, run_exporter):
    names = ['quote"d', "back\\slash", "new\nline", "ünïcødé 队列"]
    for name in names:
        redis_client.rpush(f"jobs:{name}", "x", "y")
    groups = [{"system": "custom", "pattern": "jobs:{queue}", "type": "list", "state": "pending"}]
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": groups}}})
    scrape_when(app, "queue_depth", queue=names[-1])
    text = scrape(app.server.port)
    checked = run("promtool", "check", "metrics", stdin=text)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    read = _samples(text, False)
    for name in names:
        labels = {"system": "custom", "queue": name, "priority": "", "state": "pending"}
        assert read[("queue_depth", tuple(sorted(labels.items())))] == 2
