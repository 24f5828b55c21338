"""Several Redis servers in one process: each its own source, told apart by redis_source."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from exporter.config import settings as config_module
from exporter.lifecycle.producer import EventEmitter
from exporter.output import catalog
from tests.conftest import scrape, scrape_series, scrape_when, total, value, wait_for
from tests.private_redis import PrivateRedis

ROOT = Path(__file__).resolve().parents[3]
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


def _events(url: str, key: str, system: str, completed: int) -> None:
    with EventEmitter(url, key, system=system) as emitter:
        for number in range(completed):
            emitter.emit("completed", queue="q", job_type="t", job_id=f"j{number}", duration=0.1)
        emitter.heartbeat("w1", "q", active=1, capacity=2)
    assert emitter.sent == completed + 1


def _rq_jobs(url: str, count: int) -> None:
    """Real RQ jobs, run to completion by a real burst worker on that Redis."""
    plan = json.dumps(
        [{"queue": "default", "call": "sleep_for", "seconds": 0} for _ in range(count)]
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "-m", "tests.rq_app.driver", url, "enqueue", plan],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    rq = Path(sys.executable).parent / "rq"
    subprocess.run(
        [rq, "worker", "--url", url, "--burst", "default"],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=120,
    )


def _by_source(series, name: str, **labels: str) -> dict[str | None, float]:
    return {
        dict(found).get("redis_source"): number
        for (metric, found), number in series.items()
        if metric == name and set(labels.items()) <= set(found)
    }


def test_events_and_a_native_reader_carry_the_name_of_their_redis(
    redis_client, redis_url, second_redis, run_exporter
):
    """Streams and the RQ reader on two Redis sources (and a stream on a Redis no source lists)
    carry redis_source like the key samples: each value from its own Redis."""
    other_db = second_redis.url.removesuffix("/0") + "/1"  # a database no source samples
    sources = [
        {"name": "main", "url": redis_url, "key_groups": [GROUP]},
        {"name": "eu", "url": second_redis.url, "key_groups": [GROUP]},
    ]
    streams = [
        {"key": "events:a", "start": "0", "system": "ev"},
        {"key": "events:b", "start": "0", "system": "ev", "redis": {"url": second_redis.url}},
        {"key": "events:c", "start": "0", "system": "ev", "redis": {"url": other_db}},
    ]
    _events(redis_url, "events:a", "ev", 3)
    _events(second_redis.url, "events:b", "ev", 2)
    _events(other_db, "events:c", "ev", 1)
    app = run_exporter(
        {
            "sample_interval": 0.3,
            "presets": ["rq"],
            "sources": {
                "redis": sources,
                "events": {"streams": streams},
                "native": {"rq": {"redis": {"url": second_redis.url}}},
            },
        }
    )
    # The RQ reader's first read is its baseline: jobs run after it.
    wait_for(lambda: value(scrape_series(app), "queue_exporter_source_up", source="native:rq"))
    _rq_jobs(second_redis.url, 2)

    unlisted = other_db.split("//")[1]  # named by its server: host:port/db
    completed = {"main": 3.0, "eu": 2.0, unlisted: 1.0}

    # The key samples of RQ's finished registry (under the Redis they come from, never summed
    # across the two) come on their own interval: waited for too, not seen once.
    def settled(series):
        return (
            _by_source(series, "queue_jobs_completed_total", system="ev") == completed
            and _by_source(series, "queue_jobs_completed_total", system="rq") == {"eu": 2.0}
            and _by_source(series, "queue_depth", system="rq", queue="default", state="completed")
            == {"eu": 2.0}
            and series
        )

    series = wait_for(lambda: settled(scrape_series(app)), timeout=30)
    busy = _by_source(series, "queue_workers", system="ev", state="busy")
    assert busy == {"main": 1.0, "eu": 1.0, unlisted: 1.0}
    runtimes = _by_source(series, "queue_job_execution_seconds_count", system="ev")
    assert runtimes == completed
    text = app.telemetry.render(False).decode()
    families = [
        line
        for line in text.splitlines()
        if line.startswith("queue_") and not line.startswith("queue_exporter_")
    ]
    assert all('redis_source="' in line for line in families)
    # The exporter's own series of each stream and of the reader carry it too.
    consumed = _by_source(series, "queue_exporter_events_total", stream="native:rq")
    assert list(consumed) == ["eu"] and consumed["eu"] >= 0
    assert _by_source(series, "queue_exporter_events_total", stream="events:b") == {"eu": 3.0}
    assert _by_source(series, "queue_exporter_events_total", stream="events:c") == {unlisted: 2.0}
    _assert_per_redis_self_series_carry_the_label(text)
    # The status page reads the labelled families too.
    status = json.loads(scrape(app.server.port, "/status.json"))
    assert {stream["stream"] for stream in status["streams"]} == {s["key"] for s in streams}
    assert "native:rq" in scrape(app.server.port, "/")


def test_one_redis_gives_events_and_native_series_no_label(redis_client, redis_url, run_exporter):
    _events(redis_url, "events:a", "ev", 2)
    app = run_exporter(
        {
            "sample_interval": 0.3,
            "presets": ["rq"],
            "sources": {
                "redis": {"url": redis_url},
                "events": {"streams": [{"key": "events:a", "start": "0", "system": "ev"}]},
            },
        }
    )
    wait_for(lambda: value(scrape_series(app), "queue_exporter_source_up", source="native:rq"))
    _rq_jobs(redis_url, 1)
    series = wait_for(
        lambda: (
            (s := scrape_series(app))
            and total(s, "queue_jobs_completed_total", system="rq") == 1
            and s
        ),
        timeout=30,
    )
    assert _by_source(series, "queue_jobs_completed_total", system="ev") == {None: 2.0}
    assert _by_source(series, "queue_workers", system="ev", state="busy") == {None: 1.0}
    assert _by_source(series, "queue_exporter_events_total", stream="events:a") == {None: 3.0}
    assert list(_by_source(series, "queue_exporter_events_total", stream="native:rq")) == [None]
    assert "redis_source" not in app.telemetry.render(False).decode()
    assert "events:events:a" in app.health.snapshot()  # the consumer named as it always was


@pytest.mark.parametrize(
    ("connection", "expected"),
    [
        (None, "a"),  # the default connection: the first listed source
        ({"url": "redis://h2:6379"}, "b"),  # port and database as the source's, spelt out
        ({"url": "redis://:pw@h2:6379/0"}, "b"),  # credentials do not make another Redis
        ({"url": "redis://h2:6379/3"}, "h2:6379/3"),
        ({"url": "redis+sentinel://s1,s2:26380/jobs/1"}, "s1:26379,s2:26380/jobs/1"),
        ({"url": "unix:///run/redis.sock?db=2"}, "/run/redis.sock/2"),
    ],
)
def test_a_stream_s_redis_is_named_by_the_source_on_the_same_server(connection, expected):
    from exporter.redis.connection import RedisConnectionConfig

    sources = config_module.from_dict(
        {
            "sources": {
                "redis": [
                    {"name": "a", "url": "redis://h1:6379/0"},
                    {"name": "b", "url": "redis://h2:6379/0"},
                ]
            }
        }
    ).sources
    own = None if connection is None else RedisConnectionConfig.model_validate(connection)
    assert sources.redis_source(own) == expected
    single = config_module.from_dict({"sources": {"redis": {"url": "redis://h1:6379/0"}}})
    assert single.sources.redis_source(own) is None


def test_the_inventory_says_which_redis_source_each_stream_and_reader_carries():
    from exporter.config import inventory

    raw = {
        "presets": ["rq"],
        "sources": {
            "redis": [{"name": "a", "url": "redis://h1:6379/0"}],
            "events": {"streams": ["e1", {"key": "e2", "redis": {"url": "redis://h9:6380/2"}}]},
            "native": {"rq": {"redis": {"url": "redis://:pw@h1:6379/0"}}},
        },
    }
    lines = inventory.take(config_module.from_dict(raw)).lines()
    assert "events stream e1 (v1, group queue-exporter, redis_source a)" in lines
    assert "events stream e2 (v1, group queue-exporter, redis_source h9:6380/2)" in lines
    assert "source native rq: redis://:****@h1:6379/0 (its own records, redis_source a)" in lines
    raw["sources"]["redis"] = raw["sources"]["redis"][0]
    one = inventory.take(config_module.from_dict(raw)).lines()
    assert "events stream e1 (v1, group queue-exporter)" in one
    assert not any("redis_source" in line for line in one)


def _assert_per_redis_self_series_carry_the_label(text: str) -> None:
    """Every line of the exporter's own families that name a stream or reader (the catalog's
    per_redis self-metrics) carries redis_source."""
    names = [s.name for s in catalog.ALL if s.origin == "self" and s.per_redis]
    lines = [line for line in text.splitlines() if line.split("{")[0] in names]
    assert {line.split("{")[0] for line in lines} >= {
        "queue_exporter_events_total",
        "queue_exporter_stream_lag",
    }
    assert all('redis_source="' in line for line in lines), lines


SAME_KEY = "queue-events"


def _held_pending(url: str, count: int) -> None:
    """`count` entries of SAME_KEY delivered to another consumer of the exporter's group and
    not acknowledged: pending there (claimed by the exporter only after claim_idle)."""
    _events(url, SAME_KEY, "ev", count - 1)
    client = redis.Redis.from_url(url)
    client.xgroup_create(SAME_KEY, "queue-exporter", id="0")
    assert len(client.xreadgroup("queue-exporter", "elsewhere", {SAME_KEY: ">"})[0][1]) == count
    client.close()


def test_streams_of_one_key_on_two_servers_are_counted_apart(
    redis_client, redis_url, second_redis, run_exporter
):
    """Issue 15: the same stream key on two servers is two streams, in every series, its source
    name and the status page; the lag and pending of one never hide the other's."""
    _held_pending(second_redis.url, 2)
    _events(redis_url, SAME_KEY, "ev", 5)
    redis_client.xadd(SAME_KEY, {"not": "an event"})
    _events(second_redis.url, SAME_KEY, "ev", 3)
    sources = [{"name": "main", "url": redis_url}, {"name": "eu", "url": second_redis.url}]
    streams = [
        {"key": SAME_KEY, "start": "0", "system": "ev"},
        {"key": SAME_KEY, "start": "0", "system": "ev", "redis": {"url": second_redis.url}},
    ]
    events = {"streams": streams, "stats_interval": 0.2, "claim_idle": 600}
    app = run_exporter({"sources": {"redis": sources, "events": events}})

    def settled(series):
        pending = _by_source(series, "queue_exporter_stream_pending", stream=SAME_KEY)
        return (
            _by_source(series, "queue_exporter_events_total", stream=SAME_KEY)
            == {"main": 7.0, "eu": 4.0}
            and pending == {"main": 0.0, "eu": 2.0}
            and series
        )

    series = wait_for(lambda: settled(scrape_series(app)))
    lag = _by_source(series, "queue_exporter_stream_lag", stream=SAME_KEY, group="queue-exporter")
    assert lag == {"main": 0.0, "eu": 0.0}
    assert _by_source(series, "queue_exporter_events_invalid_total", stream=SAME_KEY) == {
        "main": 1.0
    }
    assert _by_source(series, "queue_exporter_events_lost_total", stream=SAME_KEY) == {
        "main": 0.0,
        "eu": 0.0,
    }
    assert _by_source(series, "queue_jobs_completed_total", system="ev") == {
        "main": 5.0,
        "eu": 3.0,
    }
    # Each consumer its own source: one failing would not be hidden by the other.
    for name in ("main", "eu"):
        assert value(series, "queue_exporter_source_up", source=f"{SAME_KEY}@{name}") is None
        assert value(series, "queue_exporter_source_up", source=f"events:{SAME_KEY}@{name}") == 1
    _assert_per_redis_self_series_carry_the_label(app.telemetry.render(False).decode())

    status = json.loads(scrape(app.server.port, "/status.json"))
    rows = {(r["name"], r["stream"], r["redis_source"], r["pending"]) for r in status["streams"]}
    assert rows == {
        (f"{SAME_KEY}@main", SAME_KEY, "main", 0.0),
        (f"{SAME_KEY}@eu", SAME_KEY, "eu", 2.0),
    }
    assert f"stream {SAME_KEY}@main: 1 events refused" in status["view"]["warnings"]
    page = scrape(app.server.port, "/")
    assert f"<td>{SAME_KEY}@main</td>" in page and f"<td>{SAME_KEY}@eu</td>" in page


@pytest.mark.parametrize(
    ("redis", "message"),
    [
        (
            {"url": "redis://h1:6379/0"},
            "stream listed twice: s (a key on two servers needs sources.redis as a list",
        ),
        (
            [{"name": "a", "url": "redis://h1:6379/0"}, {"name": "b", "url": "redis://h2/0"}],
            "stream listed twice on one Redis: s (redis_source a)",
        ),
    ],
)
def test_one_key_twice_is_refused_unless_on_two_listed_servers(redis, message):
    """The second entry names the first Redis's server: the same stream, listed twice."""
    twice = ["s", {"key": "s", "redis": {"url": "redis://h1:6379"}}]
    with pytest.raises(config_module.ConfigError) as refused:
        config_module.from_dict({"sources": {"redis": redis, "events": {"streams": twice}}})
    assert message in str(refused.value)
    apart = ["s", {"key": "s", "redis": {"url": "redis://h2:6379/0"}}]
    several = [{"name": "a", "url": "redis://h1:6379/0"}, {"name": "b", "url": "redis://h2/0"}]
    config = config_module.from_dict({"sources": {"redis": several, "events": {"streams": apart}}})
    assert [stream.key for stream in config.sources.events.streams] == ["s", "s"]
