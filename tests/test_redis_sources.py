"""Several Redis servers in one process: each its own source, told apart by redis_source."""

from __future__ import annotations

import subprocess
import sys

import pytest

from exporter import config as config_module
from exporter.events.producer import EventEmitter
from tests.conftest import scrape_series, scrape_when, value, wait_for
from tests.private_redis import PrivateRedis

GROUP = {"system": "billing", "pattern": "jobs:{queue}", "type": "list", "state": "pending"}


@pytest.fixture
def second_redis(tmp_path):
    server = PrivateRedis(tmp_path).start()
    yield server
    server.stop()


def _depths(series):
    return {
        dict(labels).get("redis_source"): number
        for (name, labels), number in series.items()
        if name == "queue_depth" and dict(labels)["queue"] == "email"
    }


def test_two_servers_are_two_sources_each_with_its_label(
    redis_client, redis_url, second_redis, run_exporter
):
    redis_client.rpush("jobs:email", "a", "b", "c")
    other = second_redis.client()
    other.rpush("jobs:email", "x")
    sources = [
        {"name": "main", "url": redis_url, "key_groups": [GROUP]},
        {"name": "eu", "url": second_redis.url, "key_groups": [GROUP], "sample_interval": 0.3},
    ]
    app = run_exporter({"sources": {"redis": sources}})

    series = wait_for(lambda: (s := scrape_series(app)) and len(_depths(s)) == 2 and s)
    # Not summed into one queue: each Redis's depth under its own name.
    assert _depths(series) == {"main": 3.0, "eu": 1.0}
    assert value(series, "queue_exporter_source_up", source="redis:main") == 1
    assert value(series, "queue_exporter_source_up", source="redis:eu") == 1
    keys = {r.source: r.keys_matched for r in app.health.key_groups()}
    assert keys == {"redis:main": 1, "redis:eu": 1}

    # One Redis going down withdraws its series only.
    second_redis.stop()
    series = wait_for(lambda: (s := scrape_series(app)) and _depths(s) == {"main": 3.0} and s)
    assert value(series, "queue_exporter_source_up", source="redis:eu") == 0


def test_one_redis_alone_has_no_redis_source_label(redis_client, redis_url, run_exporter):
    redis_client.rpush("jobs:email", "a")
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [GROUP]}}})
    series = scrape_when(app, "queue_depth", queue="email")
    assert _depths(series) == {None: 1.0}
    assert value(series, "queue_exporter_source_up", source="redis") == 1


def test_a_family_fed_with_and_without_the_label_is_one_family(
    redis_client, redis_url, second_redis, run_exporter
):
    """Event counters of a family the samplers also feed get an empty redis_source: one HELP
    and TYPE, every line with the same label names."""
    redis_client.rpush("jobs:email", "a")
    second_redis.client().rpush("jobs:email", "b", "c")
    sources = [
        {"name": "a", "url": redis_url, "key_groups": [GROUP]},
        {"name": "b", "url": second_redis.url, "key_groups": [GROUP]},
    ]
    app = run_exporter({"sources": {"redis": sources}})
    wait_for(lambda: len(_depths(scrape_series(app))) == 2)
    text = app.telemetry.render(False).decode()
    assert text.count("# TYPE queue_depth gauge") == 1
    lines = [line for line in text.splitlines() if line.startswith("queue_depth{")]
    assert lines and all('redis_source="' in line for line in lines)


def test_top_level_presets_apply_to_each_redis_and_a_source_s_own_to_it_alone():
    config = config_module.from_dict(
        {
            "presets": ["orchestrata"],
            "sources": {
                "redis": [
                    {"name": "a", "url": "redis://a:6379/0"},
                    {"name": "b", "url": "redis://b:6379/0", "presets": ["rq"]},
                ]
            },
        }
    )
    first, second = config.sources.redis_list()
    systems = {g.system for g in first.key_groups}, {g.system for g in second.key_groups}
    assert systems == ({"orchestrata"}, {"orchestrata", "rq"})


@pytest.mark.parametrize(
    ("redis", "message"),
    [
        ([{"url": "redis://a:6379/0"}], "each Redis of the list needs a name (entry 0)"),
        (
            [{"name": "x", "url": "redis://a/0"}, {"name": "x", "url": "redis://b/0"}],
            "Redis name listed twice: x",
        ),
        ([{"name": "bad name", "url": "redis://a/0"}], "sources.redis[0].name: String should"),
        ({"url": "http://a/0"}, "sources.redis.url: Value error, URL scheme must be"),
    ],
)
def test_bad_redis_lists_are_refused_with_their_place(redis, message):
    with pytest.raises(config_module.ConfigError) as refused:
        config_module.from_dict({"sources": {"redis": redis}})
    assert message in str(refused.value)
    assert "RedisSource" not in str(refused.value)


def test_repeated_redis_url_makes_one_source_each(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text("sources:\n  redis:\n    key_groups:\n      - " + str(GROUP) + "\n")
    urls = ("redis://:secret1@h1:6379/0", "redis://h2:6380/1")
    config = config_module.load(file, {"redis_url": urls})
    sources = config.sources.redis_list()
    assert [(s.name, s.url.get_secret_value()) for s in sources] == [
        ("redis1", urls[0]),
        ("redis2", urls[1]),
    ]
    assert all(s.key_groups[0].pattern == "jobs:{queue}" for s in sources)

    shown = subprocess.run(
        [sys.executable, "-m", "exporter", "check-config", str(file)]
        + [word for url in urls for word in ("--redis-url", url)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert "source redis keys redis1: redis://:****@h1:6379/0" in shown.stdout
    assert "source redis keys redis2: redis://h2:6380/1" in shown.stdout
    assert "secret1" not in shown.stdout + shown.stderr


def test_a_stream_on_its_own_redis_is_consumed_there(
    redis_client, redis_url, second_redis, run_exporter
):
    streams = [
        {"key": "events:a", "start": "0"},
        {"key": "events:b", "start": "0", "redis": {"url": second_redis.url}},
    ]
    for url, key, system in (
        (redis_url, "events:a", "alpha"),
        (second_redis.url, "events:b", "beta"),
    ):
        with EventEmitter(url, key, system=system) as emitter:
            emitter.emit("completed", queue="q", job_type="t", job_id="j", runtime=0.1)
        assert emitter.sent == 1
    app = run_exporter({"sources": {"redis": {"url": redis_url}, "events": {"streams": streams}}})

    def completed(series):
        return [value(series, "queue_jobs_completed_total", system=s) for s in ("alpha", "beta")]

    wait_for(lambda: completed(scrape_series(app)) == [1, 1])


def test_rq_celery_and_sidekiq_readers_on_a_cluster_are_refused_by_name():
    """Those systems do not run on a Redis Cluster; BullMQ, Runner-Q streams and the lease do
    (test_cluster_native.py)."""
    cluster = {"url": "redis+cluster://r0:6379,r1:6379"}
    with pytest.raises(config_module.ConfigError) as refused:
        config_module.from_dict(
            {
                "presets": ["rq", "sidekiq", "bullmq", "runnerq"],
                "leader_election": {"enabled": True},
                "sources": {"redis": cluster},
            }
        )
    message = str(refused.value)
    assert "sources.native.rq, sources.native.sidekiq: RQ, Celery" in message
    assert "do not run on a Redis Cluster" in message and "native: false" in message
    assert "bullmq" not in message and "events" not in message and "leader" not in message
    celery = {"celery": {"enabled": True, "redis": cluster}}
    with pytest.raises(config_module.ConfigError, match=r"sources\.native\.celery: RQ"):
        config_module.from_dict({"sources": {"native": celery}})
    accepted = config_module.from_dict(
        {
            "presets": [{"name": "rq", "params": {"native": False}}, "bullmq", "runnerq"],
            "leader_election": {"enabled": True},
            "sources": {
                "redis": cluster,
                "native": {"sidekiq": {"redis": {"url": "redis://sidekiq:6379/0"}}},
            },
        }
    )
    assert accepted.sources.default_redis().is_cluster
    assert accepted.sources.native.bullmq.enabled and accepted.sources.native.sidekiq.enabled
