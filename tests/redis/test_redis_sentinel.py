"""Behind Sentinel: the master is found, and a failover is followed by sampling and consuming
alike, with every event in the stream counted once (real redis-server and Sentinels)."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from exporter.commands import redis_acl
from exporter.config import settings as config_module
from exporter.config.settings import ConfigError, from_dict
from exporter.redis.connection import RedisConnectionConfig, redis_error_reason, sentinel_target
from tests.conftest import scrape_series, value, wait_for
from tests.redis_topology import SERVICE, SentinelSetup, eventually
from tests.tls_certs import make_pki

INTERVAL = 0.3
KEYS = 2000  # a cycle long enough for the failover to land in one
GROUP = {"system": "billing", "pattern": "jobs:{queue}", "type": "list", "state": "pending"}
STREAM = "events:billing"


@pytest.fixture
def sentinel_setup(tmp_path):
    setup = SentinelSetup(tmp_path, sentinel_password="sentinel-secret-1").start()
    yield setup
    setup.stop()


def _completed(series):
    return value(series, "queue_jobs_completed_total", system="billing", queue="q")


def _completed_in_stream(client: redis.Redis) -> int:
    return sum(1 for _, fields in client.xrange(STREAM) if fields.get(b"event") == b"completed")


def _emit(client: redis.Redis, start: int, count: int) -> None:
    for number in range(start, start + count):
        fields = {"v": "1", "event": "completed", "ts": f"{time.time():.3f}"}
        fields |= {"system": "billing", "queue": "q"}
        client.xadd(STREAM, {**fields, "job_id": f"j{number}", "job_type": "t", "runtime": "0.1"})


def _sampling_and_consuming(run_exporter, redis_settings, completed: int, depth: int):
    """An exporter sampling GROUP and consuming STREAM through `redis_settings`, once one
    scrape shows both: events and samples arrive on their own threads."""
    app = run_exporter(
        {
            "sample_interval": INTERVAL,
            "sources": {
                "redis": redis_settings,
                "events": {"streams": [{"key": STREAM, "start": "0"}], "block_ms": 100},
            },
        }
    )
    wait_for(
        lambda: (
            (s := scrape_series(app))
            and _completed(s) == completed
            and value(s, "queue_depth", queue="email") == depth
        )
    )
    return app


def test_sampling_and_consuming_follow_a_sentinel_failover(sentinel_setup, run_exporter):
    connection = RedisConnectionConfig(
        url=sentinel_setup.url, sentinel_password="sentinel-secret-1", socket_timeout=2
    )
    writer = connection.connect()
    pipe = writer.pipeline(transaction=False)
    for number in range(KEYS):
        pipe.rpush(f"jobs:filler{number}", "x")
    pipe.rpush("jobs:email", "a", "b", "c")
    pipe.execute()
    _emit(writer, 0, 50)
    redis_settings = {
        "url": sentinel_setup.url,
        "sentinel_password": "sentinel-secret-1",
        "socket_timeout": 2,
        # The default deadline (the interval) timed 2000 keys' cycles out on a loaded machine,
        # withdrawing the series this test waits for; a failover fails the cycle it lands in
        # without one (the old master's connections are killed).
        "cycle_timeout": 10,
        "key_groups": [GROUP],
    }
    app = _sampling_and_consuming(run_exporter, redis_settings, completed=50, depth=3)
    old_master = sentinel_setup.master.port

    # Mid-stream: events keep coming while the master changes under the consumer.
    stop = threading.Event()
    emitted = [50]

    def produce() -> None:
        while not stop.is_set():
            try:
                _emit(writer, emitted[0], 1)
                emitted[0] += 1
            except redis.RedisError:
                stop.wait(0.05)  # the master is changing: the next connection finds the new one

    producer = threading.Thread(target=produce)
    producer.start()
    new_master = sentinel_setup.failover()
    assert new_master == sentinel_setup.replica.port != old_master
    stop.set()
    producer.join()

    # Sampling reads the new master: a change made there alone shows within a few intervals.
    with sentinel_setup.replica.client() as promoted:
        eventually(lambda: promoted.rpush("jobs:email", "d"))
        in_stream = _completed_in_stream(promoted)
    assert in_stream == emitted[0]  # a write acknowledged by Redis is in the stream
    # In one scrape: a cycle's series are published a moment before its source is marked up.
    eventually(
        lambda: (
            (s := scrape_series(app))
            and value(s, "queue_depth", queue="email") == 4
            and value(s, "queue_exporter_source_up", source="redis") == 1
        )
    )
    # Every completed event the stream holds counted, none twice, and it stays so.
    eventually(lambda: _completed(scrape_series(app)) == in_stream)
    wait_for(lambda: app.telemetry.health.snapshot()["redis"].up)
    assert _completed(scrape_series(app)) == in_stream
    writer.close()


def test_sentinel_urls_are_checked_and_masked():
    target = sentinel_target("redis+sentinel://:pw@h1:26379,h2:26380/mymaster/2")
    assert target.sentinels == (("h1", 26379), ("h2", 26380))
    assert (target.service, target.db, target.password, target.tls) == ("mymaster", 2, "pw", False)
    assert sentinel_target("rediss+sentinel://h1:1/s").tls
    for bad, message in (
        ("redis+sentinel://h1:26379", "ends in /<service name>"),
        ("redis+sentinel://h1:x/s", "each node must be host:port"),
        ("redis+sentinel://:pw@h1:26379/s/zero", "ends in /<service name>"),
    ):
        with pytest.raises(ConfigError) as refused:
            from_dict({"sources": {"redis": {"url": bad}}})
        assert message in str(refused.value)
        assert "pw" not in str(refused.value)
    config = from_dict({"sources": {"redis": {"url": "redis+sentinel://:pw@h1:1,h2:2/s/0"}}})
    assert config.sources.default_redis().masked_url() == "redis+sentinel://:****@h1:1,h2:2/s/0"


def test_a_wrong_sentinel_password_is_an_auth_failure(sentinel_setup):
    wrong = RedisConnectionConfig(
        url=sentinel_setup.url, sentinel_password="not-it", socket_timeout=2
    )
    with pytest.raises(redis.ConnectionError) as refused:
        wrong.connect().ping()
    assert redis_error_reason(refused.value) == "auth"
    assert "not-it" not in str(refused.value)
    right = RedisConnectionConfig(
        url=sentinel_setup.url, sentinel_password="sentinel-secret-1", socket_timeout=2
    )
    client = right.connect()
    assert client.ping()
    assert client.connection_pool.service_name == SERVICE
    client.close()


def _calls(client: redis.Redis, command: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_read_from_replica_keeps_scan_and_reads_off_the_master(sentinel_setup, run_exporter):
    connection = RedisConnectionConfig(
        url=sentinel_setup.url, sentinel_password="sentinel-secret-1", socket_timeout=2
    )
    writer = connection.connect()
    writer.rpush("jobs:email", "a", "b")
    writer.execute_command("WAIT", 1, 2000)
    redis_settings = {
        "url": sentinel_setup.url,
        "sentinel_password": "sentinel-secret-1",
        "read_from": "replica",
        "key_groups": [GROUP],
    }
    with sentinel_setup.master.client() as master, sentinel_setup.replica.client() as replica:
        master.config_resetstat()
        replica.config_resetstat()
        app = run_exporter({"sample_interval": INTERVAL, "sources": {"redis": redis_settings}})
        wait_for(lambda: value(scrape_series(app), "queue_depth", queue="email") == 2)
        assert _calls(replica, "scan") > 0 and _calls(replica, "llen") > 0
        assert _calls(master, "scan") == _calls(master, "llen") == 0
    writer.close()


def test_runs_behind_sentinel_with_exactly_the_acls_redis_acl_prints(sentinel_setup, run_exporter):
    raw = {
        "sources": {
            "redis": {
                "url": sentinel_setup.url,
                "username": "exporter",
                "password": "acl-secret-1",
                "sentinel_username": "exporter",
                "sentinel_password": "acl-secret-2",
                "key_groups": [GROUP],
            }
        }
    }
    config = config_module.from_dict(raw)
    data_rules = redis_acl.acl_rules(config)
    sentinel_line = redis_acl.sentinel_setuser_line(config, "exporter", "acl-secret-2")
    assert sentinel_line is not None
    with sentinel_setup.master.client() as master:
        master.rpush("jobs:email", "a")
    for server in (sentinel_setup.master, sentinel_setup.replica):
        with server.client() as client:
            client.execute_command(
                "ACL", "SETUSER", "exporter", "reset", "on", ">acl-secret-1", *data_rules
            )
    for index in range(len(sentinel_setup.sentinel_ports)):
        with sentinel_setup.sentinel_client(index) as client:
            client.execute_command(*sentinel_line.split())
    app = run_exporter({"sample_interval": INTERVAL, **raw})
    # In one scrape: a cycle's series are published a moment before its source is marked up.
    wait_for(
        lambda: (
            (s := scrape_series(app))
            and value(s, "queue_depth", queue="email") == 1
            and value(s, "queue_exporter_source_up", source="redis") == 1
        )
    )


def test_a_tls_sentinel_setup_is_sampled_and_its_stream_consumed(tmp_path, run_exporter):
    """rediss+sentinel://: the Sentinels, the master and the replica speak TLS only and ask for
    a client certificate; sampling and consuming both find the master through them."""
    pki = make_pki(tmp_path / "pki")
    setup = SentinelSetup(
        tmp_path, sentinel_password="sentinel-secret-1", tls=pki.directory
    ).start()
    try:
        tls_files = {
            "tls_ca_file": str(pki.path("ca.crt")),
            "tls_cert_file": str(pki.path("client.crt")),
            "tls_key_file": str(pki.path("client.key")),
        }
        connection = RedisConnectionConfig(
            url=setup.url, sentinel_password="sentinel-secret-1", **tls_files
        )
        writer = connection.connect()
        writer.rpush("jobs:email", "a", "b", "c")
        _emit(writer, 0, 5)
        writer.close()
        plain = RedisConnectionConfig(
            url=setup.url.replace("rediss+", "redis+"),
            sentinel_password="sentinel-secret-1",
            socket_timeout=1,
        )
        with pytest.raises(redis.RedisError):  # no plain TCP: what worked used TLS
            plain.connect().ping()
        redis_settings = {
            "url": setup.url,
            "sentinel_password": "sentinel-secret-1",
            **tls_files,
            "key_groups": [GROUP],
        }
        _sampling_and_consuming(run_exporter, redis_settings, completed=5, depth=3)
    finally:
        setup.stop()
