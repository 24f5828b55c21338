"""Leader election: the lease, fencing, stepping down, followers standing by, takeover.

The kill-the-leader test with real `queue-exporter serve` processes is in test_chaos.py.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from exporter.config.settings import ConfigError, from_dict
from exporter.leader.config import LeaderElectionConfig
from exporter.leader.election import Leadership
from exporter.output.catalog import BY_NAME
from exporter.output.health import HealthBoard
from exporter.output.telemetry import Telemetry
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.runner import SourceRunner
from exporter.sources.source import SourceReport
from tests.conftest import REDIS_HOST, REDIS_PORT, scrape, scrape_series, value, wait_for
from tests.plain_source import PlainSource
from tests.tcp_proxy import TcpProxy
from tests.timing import wake_up_lag

KEY = "queue-exporter:leader"
KEY_GROUP = {"system": "app", "pattern": "jobs:{queue}", "type": "list", "state": "pending"}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _leadership(url: str, ttl: float = 10.0, clock=None, identity: str = "pod") -> Leadership:
    config = LeaderElectionConfig(
        enabled=True, lease_ttl=ttl, renew_interval=ttl / 4, identity=identity
    )
    connection = RedisConnectionConfig(url=url, socket_timeout=1)
    return Leadership(config, connection, clock) if clock else Leadership(config, connection)


def test_one_holder_at_a_time_and_fencing_tokens_grow(redis_url, redis_client):
    first, second = _leadership(redis_url), _leadership(redis_url, identity="other")
    assert first.renew() and first.token() == 1
    assert not second.renew() and second.token() is None
    assert first.renew() and first.token() == 1  # a renewal keeps the token
    holder = redis_client.get(KEY).decode()
    assert holder == f"1:{first.holder}"
    assert 0 < redis_client.pttl(KEY) <= 10_000

    first.release()
    assert not first.is_leader() and redis_client.get(KEY) is None
    assert second.renew() and second.token() == 2  # a new lease, a new token
    first.release()  # releasing a lease one does not hold leaves it alone
    assert redis_client.get(KEY).decode() == f"2:{second.holder}"


def test_the_lease_survives_a_flushed_script_cache(redis_url, redis_client):
    """A SCRIPT FLUSH (or a restarted server) empties the cache: the scripts load again."""
    leadership = _leadership(redis_url)
    assert leadership.renew() and leadership.token() == 1
    redis_client.script_flush()
    assert leadership.renew() and leadership.token() == 1
    redis_client.script_flush()
    leadership.release()
    assert redis_client.get(KEY) is None


def test_two_processes_with_one_identity_do_not_share_the_lease(redis_url):
    first, second = _leadership(redis_url), _leadership(redis_url)
    assert first.renew()
    assert not second.renew()


def test_a_dead_leaders_lease_expires_and_is_taken_over(redis_url):
    ttl, attempts_every = 2.0, 0.05
    dead, follower = _leadership(redis_url, ttl=ttl), _leadership(redis_url, ttl=ttl)
    lag = wake_up_lag()  # how late this machine wakes a waiting thread now
    renewed_at = time.monotonic()
    assert dead.renew()
    assert not follower.renew()
    wait_for(follower.renew, timeout=10, interval=attempts_every)
    # Within the lease's TTL of the last renewal: a quarter of it is room for the follower's
    # next attempt, and the lag measured above for a busy machine's wake-ups.
    assert time.monotonic() - renewed_at < 1.25 * ttl + 5 * lag
    assert follower.token() == 2


def test_leader_steps_down_when_redis_is_unreachable_for_the_lease_time(redis_db):
    proxy = TcpProxy(REDIS_HOST, REDIS_PORT).start()
    clock = FakeClock()
    leader = _leadership(f"redis://127.0.0.1:{proxy.port}/{redis_db}", ttl=10, clock=clock)
    try:
        assert leader.renew()
        proxy.cut()
        clock.now += 5
        assert leader.renew()  # unreachable, but the lease it renewed cannot have expired yet
        assert leader.is_leader()
        clock.now += 5  # lease_ttl after the last renewal was sent: it may be gone in Redis
        assert not leader.renew()
        assert not leader.is_leader()
        proxy.start()
        assert leader.renew()  # its key has not expired in Redis (real time): renewed, same token
        assert leader.token() == 1
    finally:
        proxy.cut()


class _Source(PlainSource):
    """A sampling source whose cycle can run a callback in the middle (a lease change)."""

    name = "fake"
    interval = 0.05

    def __init__(self, during=None) -> None:
        self.during = during
        self.cycles = 0

    def sample(self) -> SourceReport:
        self.cycles += 1
        if self.during is not None:
            self.during()
        report = SourceReport()
        report.samples.add(BY_NAME["queue_depth"], {"system": "s", "queue": "q"}, 1.0)
        return report


def test_a_cycle_whose_lease_changed_hands_is_not_published(redis_url):
    telemetry = Telemetry(HealthBoard())
    leader, other = _leadership(redis_url), _leadership(redis_url, identity="other")
    assert leader.renew()

    def lose_lease() -> None:
        leader.release()
        other.renew()

    runner = SourceRunner(_Source(lose_lease), telemetry, threading.Event(), leader)
    assert runner.run_once()
    assert telemetry.store.snapshot_series() == {}
    status = telemetry.health.snapshot()["fake"]
    assert status.standby and status.up  # standing by, not failing

    runner = SourceRunner(_Source(), telemetry, threading.Event(), other)
    assert runner.run_once()
    assert telemetry.store.snapshot_series()  # the new leader's cycle is published
    telemetry.shutdown()


def test_a_body_rendered_under_a_lease_is_not_sent_once_the_lease_has_passed(redis_url):
    """A process stopped between a render and its write (SIGSTOP, issue 23 attack 21) must
    not send, on resuming, the body of a lease that lapsed meanwhile (the HTTP server asks
    the render's still_served right before the write, and renders again)."""
    clock = FakeClock()
    telemetry = Telemetry(HealthBoard())
    leader = _leadership(redis_url, ttl=10, clock=clock)
    assert leader.renew()
    runner = SourceRunner(_Source(), telemetry, threading.Event(), leader)
    assert runner.run_once()
    rendered = telemetry.render_fenced(False)
    assert b"\nqueue_depth{" in rendered.body and rendered.still_served()
    clock.now += 10  # stopped past lease_ttl: the lease may be another replica's by now
    assert not rendered.still_served()
    again = telemetry.render_fenced(False)
    assert b"\nqueue_depth{" not in again.body and again.still_served()
    assert not rendered.still_served()  # a later render gives the passed one no right
    telemetry.shutdown()


def test_every_body_keeps_its_own_right_to_be_sent_however_many_were_rendered(redis_url):
    """The right to be sent travels with each body (exposition.Rendered), not in a table of
    recent renders: 100 bodies rendered under one lease are each sendable while it is held,
    and none once it has passed (before, only the last 16 were known, by their id())."""
    clock = FakeClock()
    telemetry = Telemetry(HealthBoard())
    leader = _leadership(redis_url, ttl=10, clock=clock)
    assert leader.renew()
    runner = SourceRunner(_Source(), telemetry, threading.Event(), leader)
    assert runner.run_once()
    rendered = [telemetry.render_fenced(openmetrics=bool(i % 2)) for i in range(100)]
    assert all(b"\nqueue_depth{" in each.body for each in rendered)
    assert all(each.still_served() for each in rendered)
    clock.now += 10  # the lease has passed
    assert not any(each.still_served() for each in rendered)
    telemetry.shutdown()


def test_replicas_share_sampling_through_the_lease(redis_client, redis_url, run_exporter):
    redis_client.rpush("jobs:emails", "a", "b")
    election = {"enabled": True, "lease_ttl": 3, "renew_interval": 0.2}
    raw = {"sources": {"redis": {"url": redis_url, "key_groups": [KEY_GROUP]}}}
    first = run_exporter({**raw, "leader_election": {**election, "identity": "one"}})
    wait_for(lambda: value(scrape_series(first), "queue_depth", queue="emails") == 2)
    second = run_exporter({**raw, "leader_election": {**election, "identity": "two"}})
    wait_for(lambda: second.health.snapshot()["redis"].standby)

    leader, follower = scrape_series(first), scrape_series(second)
    assert value(leader, "queue_exporter_leader") == 1
    assert value(follower, "queue_exporter_leader") == 0
    assert value(follower, "queue_depth", queue="emails") is None  # only the leader serves it
    assert value(follower, "queue_exporter_source_up", source="redis") is None
    assert value(leader, "queue_exporter_source_up", source="redis") == 1
    assert json.loads(scrape(second.server.port, "/readyz"))["ready"] is True

    first.shutdown()  # releases the lease: the follower takes over at its next attempt
    wait_for(lambda: value(scrape_series(second), "queue_depth", queue="emails") == 2)
    assert value(scrape_series(second), "queue_exporter_leader") == 1
    assert redis_client.get(KEY).decode().startswith("2:two/")


def test_without_election_every_replica_samples_and_reports_leader(redis_url, run_exporter):
    app = run_exporter({"sources": {"redis": {"url": redis_url, "key_groups": [KEY_GROUP]}}})
    assert value(scrape_series(app), "queue_exporter_leader") == 1
    assert app.leadership is None


def test_config_section(redis_url):
    config = from_dict({"leader_election": {"enabled": True, "lease_ttl": 20}})
    assert config.leader_election.key == KEY
    assert config.leader_election.renew_interval == 5.0
    with pytest.raises(ConfigError, match=r"leader_election: .*renew_interval"):
        from_dict({"leader_election": {"lease_ttl": 2, "renew_interval": 2}})
    with pytest.raises(ConfigError, match=r"leader_election\.lease_tll"):
        from_dict({"leader_election": {"lease_tll": 2}})


def test_identity_comes_from_pod_name(monkeypatch):
    monkeypatch.setenv("POD_NAME", "exporter-7f9c")
    assert LeaderElectionConfig().holder_name().startswith("exporter-7f9c/")


def test_lease_password_is_masked_in_the_effective_config():
    from exporter.config.effective import effective_yaml

    config = from_dict(
        {"leader_election": {"enabled": True, "redis": {"url": "redis://:s3cret@127.0.0.1:6379/0"}}}
    )
    text = effective_yaml(config)
    assert "s3cret" not in text and "****" in text


def test_redis_errors_do_not_escape_renew():
    leader = _leadership("redis://127.0.0.1:1/0")
    assert leader.renew() is False
    leader.release()


def test_a_lease_without_answers_is_a_problem_once_it_could_have_expired(redis_db):
    """A blip shorter than lease_ttl is not an outage (the leader still holds its lease); once
    no attempt was answered for lease_ttl, problem() names why; an answer clears it."""
    proxy = TcpProxy(REDIS_HOST, REDIS_PORT).start()
    clock = FakeClock()
    leader = _leadership(f"redis://127.0.0.1:{proxy.port}/{redis_db}", ttl=10, clock=clock)
    try:
        assert leader.renew()
        assert leader.problem() is None
        proxy.cut()
        clock.now += 5
        leader.renew()
        assert leader.problem() is None  # within the lease it renewed: not yet an outage
        clock.now += 5
        assert not leader.renew()
        problem = leader.problem()
        assert problem is not None and problem.startswith("connection")
        proxy.start()
        assert leader.renew()
        assert leader.problem() is None
    finally:
        proxy.cut()


def test_a_leader_that_loses_its_lease_between_cycles_stands_by_before_its_next_cycle(
    redis_url, run_exporter, redis_client
):
    """The series go at once (the render checks the lease); the source's own state follows
    within the standby poll, not at the next cycle an interval later."""
    redis_client.rpush("jobs:emails", "a")
    election = {"enabled": True, "lease_ttl": 3, "renew_interval": 0.2, "identity": "one"}
    raw = {"sources": {"redis": {"url": redis_url, "key_groups": [KEY_GROUP]}}}
    app = run_exporter({**raw, "leader_election": election}, sample_interval=60)
    wait_for(lambda: value(scrape_series(app), "queue_depth", queue="emails") == 1)
    assert app.leadership is not None
    app.leadership.release()  # as if the lease had passed to another replica
    redis_client.set(KEY, "99:another/replica", px=60_000)
    series = scrape_series(app)
    assert value(series, "queue_depth", queue="emails") is None
    wait_for(lambda: app.health.snapshot()["redis"].standby, timeout=5)
    assert value(scrape_series(app), "queue_exporter_source_up", source="redis") is None
