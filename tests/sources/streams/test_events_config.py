"""The sources.events section: short forms, flags, defaults, errors that name their place."""

from __future__ import annotations

import pytest

from exporter.config import settings as config_module
from exporter.config.effective import effective_yaml
from exporter.sources.streams.config import EventsSourceConfig

pytestmark = pytest.mark.fast  # no server (scripts/test.sh --fast)


def test_events_stream_flag_and_short_form():
    config = config_module.load(None, {"events_stream": ("app:events", "other:events")})
    events = config.sources.events
    assert events is not None
    assert [(s.key, s.system, s.format, s.group, s.start) for s in events.streams] == [
        ("app:events", "custom", "v1", "queue-exporter", "$"),
        ("other:events", "custom", "v1", "queue-exporter", "$"),
    ]


def test_runnerq_preset_reads_its_events_stream():
    config = config_module.from_dict(
        {"presets": [{"name": "runnerq", "params": {"queue": "payments"}}]}
    )
    assert config.sources.events is not None
    [stream] = config.sources.events.streams
    assert (stream.key, stream.format, stream.system) == (
        "payments:events_stream",
        "runnerq",
        "runnerq",
    )
    assert stream.queue_name == "payments"


def test_consumer_name_comes_from_the_pod(monkeypatch):
    monkeypatch.setenv("POD_NAME", "exporter-7d9f-abcde")
    assert EventsSourceConfig().consumer_name() == "exporter-7d9f-abcde"
    monkeypatch.delenv("POD_NAME")
    monkeypatch.setenv("HOSTNAME", "host-1")
    assert EventsSourceConfig().consumer_name() == "host-1"
    assert EventsSourceConfig(consumer="fixed").consumer_name() == "fixed"


def test_buckets_default_per_histogram_and_can_be_configured():
    buckets = EventsSourceConfig(histogram_buckets={"queue_job_wait_seconds": [1, 10]}).buckets()
    assert buckets["queue_job_wait_seconds"] == (1, 10)
    assert buckets["queue_backend_operation_seconds"][0] == 0.0005
    assert set(buckets) >= {"queue_job_attempts", "queue_reaper_cycle_seconds"}


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ({"histogram_buckets": {"queue_depth": [1]}}, "'queue_depth' is not an event histogram"),
        ({"histogram_buckets": {"queue_job_wait_seconds": [5, 1]}}, "non-empty increasing"),
        ({"streams": ["a", "a"]}, "stream listed twice: a"),
        ({"streams": [{"key": "a", "format": "json"}]}, "sources.events.streams[0].format"),
        ({"batch_size": 0}, "sources.events.batch_size"),
    ],
)
def test_errors_name_their_place(events, message):
    with pytest.raises(config_module.ConfigError) as raised:
        config_module.from_dict({"sources": {"events": events}})
    assert message in str(raised.value)


def test_effective_config_masks_the_events_password():
    config = config_module.from_dict(
        {"sources": {"events": {"streams": ["s"], "redis": {"url": "redis://u:secret@h:6379/0"}}}}
    )
    text = effective_yaml(config)
    assert "secret" not in text and "u:****@h:6379" in text
