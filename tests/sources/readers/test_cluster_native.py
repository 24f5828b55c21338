"""What runs on a real Redis Cluster (3 primaries, 3 replicas) besides key sampling and v1
streams: the BullMQ reader beside a real BullMQ that runs on the cluster itself, a Runner-Q
stream whose activity hashes lie in every slot, and the leader lease; all of it with exactly
the ACL `queue-exporter redis-acl` prints. RQ, Celery and Sidekiq readers stay refused there
(test_redis_sources.py): those systems do not run on a cluster."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from redis.exceptions import MovedError

from exporter.commands import redis_acl
from exporter.config import settings as config_module
from exporter.leader.config import LeaderElectionConfig
from exporter.leader.election import Leadership
from exporter.lifecycle.metrics import Tally
from exporter.lifecycle.refusals import Refusals
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.readers.framework import Signals
from exporter.sources.readers.runnerq import RunnerQDecoder
from tests.conftest import scrape_series, total, wait_for
from tests.leader.test_leader import FakeClock
from tests.real_queues import BULLMQ_MAJORS, BullMQ
from tests.redis_topology import ClusterSetup
from tests.sources.readers.test_events_runnerq import (
    RunnerQ,
    _run_day,
    assert_the_day,
    wait_for_the_day,
)

# BullMQ queues whose names are hash tags: each queue's keys in one slot, the queues spread.
QUEUES = ("{emails}", "{reports}", "{images}")
# Or a prefix that is a hash tag, as BullMQ's docs have it: every queue in one slot.
TAGGED_PREFIX = "{bull}"
PLAIN_QUEUES = ("emails", "reports", "images")
NATIVE = "native:bullmq"
LEASE = "queue-exporter:leader"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[ClusterSetup]:
    setup = ClusterSetup(tmp_path_factory.mktemp("cluster")).start()
    yield setup
    setup.stop()


@pytest.fixture
def empty(cluster: ClusterSetup) -> ClusterSetup:
    with cluster.client() as client:
        client.flushall(target_nodes="primaries")
    return cluster


def _seeds(cluster: ClusterSetup) -> list[tuple[str, int]]:
    return [("127.0.0.1", node.port) for node in cluster.nodes[:2]]


def _bullmq_work(bullmq: BullMQ, queues: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """Jobs on every queue that a real BullMQ Worker completes or fails; (completed, failed)."""
    expected = {}
    for number, queue in enumerate(queues):
        ok, broken = number + 2, number + 1
        bullmq.steps(
            {"op": "add", "queue": queue, "name": "ok", "count": ok},
            {"op": "add", "queue": queue, "name": "broken", "count": broken, "data": {"fail": 1}},
            {"op": "work", "queue": queue, "completed": ok, "failed": broken},
        )
        expected[queue] = (ok, broken)
    return expected


def _bullmq_settled(app, truth: dict[str, Any]) -> bool:
    series = scrape_series(app)
    for queue, report in truth.items():
        completed = total(series, "queue_jobs_completed_total", system="bullmq", queue=queue)
        failed = total(
            series,
            "queue_jobs_failed_total",
            system="bullmq",
            queue=queue,
            error_type="non_retryable",
        )
        if (completed, failed) != (report["counts"]["completed"], report["counts"]["failed"]):
            return False
    return True


@pytest.mark.parametrize(
    ("major", "prefix", "queues"),
    [
        *(pytest.param(m, "bull", QUEUES, id=f"bullmq{m}-tagged-queues") for m in BULLMQ_MAJORS),
        pytest.param(BULLMQ_MAJORS[-1], TAGGED_PREFIX, PLAIN_QUEUES, id="tagged-prefix"),
    ],
)
def test_bullmq_on_a_cluster_counts_what_bullmq_reports(empty, run_exporter, major, prefix, queues):
    cluster = empty
    events = {cluster.primary_of(f"{prefix}:{queue}:events").port for queue in queues}
    assert (len(events) == 1) == (prefix == TAGGED_PREFIX)  # one slot, or spread over nodes
    bullmq = BullMQ(major, 0, cluster=_seeds(cluster), prefix=prefix)
    try:
        bullmq.steps(*({"op": "add", "queue": queue, "name": "first"} for queue in queues))
        preset = {"name": "bullmq", "params": {"prefix": prefix}}
        app = run_exporter({"presets": [preset], "sources": {"redis": {"url": cluster.url}}})
        wait_for(lambda: _reading(app))
        expected = _bullmq_work(bullmq, queues)
        truth = bullmq.truth(list(queues))["queues"]
        for queue, (ok, broken) in expected.items():  # BullMQ's own word: what ran where
            assert (truth[queue]["counts"]["completed"], truth[queue]["counts"]["failed"]) == (
                ok + 1,
                broken,
            )
        # The first jobs were added before the reader's baseline, but completed after it.
        wait_for(lambda: _bullmq_settled(app, truth), timeout=30)
        series = scrape_series(app)
        for queue, (ok, broken) in expected.items():
            started = total(series, "queue_jobs_started_total", system="bullmq", queue=queue)
            assert started == ok + 1 + broken
            enqueued = total(series, "queue_jobs_enqueued_total", system="bullmq", queue=queue)
            assert enqueued == ok + broken
        assert total(series, "queue_exporter_events_lost_total", stream=NATIVE) == 0
        assert app.health.snapshot()[NATIVE].up

        def sampled() -> dict[str, float]:  # the key sampler reads the same layout
            return {
                queue: total(
                    scrape_series(app), "queue_depth", system="bullmq", queue=queue, state="failed"
                )
                for queue in queues
            }

        wait_for(lambda: sampled() == {q: truth[q]["counts"]["failed"] for q in queues})
    finally:
        bullmq.stop_all()


class _DayOnACluster:
    """RunnerQ's writes, recorded, then replayed through a cluster client: every activity
    hash first, then the stream, so that the exporter reads the hashes as they are at the
    day's end (on one server a MULTI does this; a cluster's keys lie on several nodes)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))

    def replay(self, client) -> None:
        hashes = [call for call in self.calls if str(self._key(call)).startswith("activity:")]
        for name, args, kwargs in hashes + [c for c in self.calls if c not in hashes]:
            getattr(client, name)(*args, **kwargs)

    @staticmethod
    def _key(call: tuple[str, tuple[Any, ...], dict[str, Any]]) -> Any:
        name, args, _ = call
        return args[1] if name == "execute_command" else args[0]


def test_runnerq_stream_on_a_cluster_reads_activity_hashes_of_every_slot(empty, run_exporter):
    cluster = empty
    app = run_exporter({"presets": ["runnerq"], "sources": {"redis": {"url": cluster.url}}})
    wait_for(lambda: app.health.snapshot()["events:default:events_stream"].up)
    # The day's five activities get random ids: one day in 81 puts every hash on one primary,
    # so days are recorded (nothing written yet) until one spans several.
    for _ in range(10):
        day = _DayOnACluster()
        entries = _run_day(RunnerQ(day), time.time() - 100)
        activities = {args[0] for name, args, _ in day.calls if name == "hset"}
        if len({cluster.primary_of(key).port for key in activities}) > 1:
            break
    assert len({cluster.primary_of(key).port for key in activities}) > 1
    with cluster.client() as client:
        day.replay(client)
    assert_the_day(wait_for_the_day(app, entries))


def test_a_redirect_is_a_read_to_retry_not_a_fault_of_the_record(empty):
    """A node that does not own a key answers MOVED: the Runner-Q decoder and a native reader's
    record boundary raise it (the read is tried again with the slot map read anew) instead of
    refusing the entry or the record."""
    cluster, key = empty, "activity:4b1d"
    owner = cluster.primary_of(key)
    with cluster.client() as client:
        client.hset(key, mapping={"activity_type": "ping", "priority": '"High"'})
        primaries = [node for node in client.get_primaries() if node.port != owner.port]
    event = {"activity_id": "4b1d", "timestamp": "2026-01-01T00:00:00Z", "event_type": "Enqueued"}
    entry = (b"1-0", {b"event": json.dumps(event).encode()})
    tally = Tally()
    with redis.Redis(port=primaries[0].port) as elsewhere:
        decoder = RunnerQDecoder("runnerq", "default", cache_size=10, max_future=60)
        with pytest.raises(MovedError):
            decoder.decode(elsewhere, [entry], time.time(), tally, Refusals("s"))
        signals = Signals()
        with pytest.raises(MovedError), signals.record(key):
            elsewhere.hmget(key, ["activity_type"])
    assert tally.invalid == {} and signals.tally.invalid == {}


@pytest.fixture
def own_cluster(tmp_path) -> Iterator[ClusterSetup]:
    """A cluster of its own: the test kills a primary for good."""
    setup = ClusterSetup(tmp_path).start()
    yield setup
    setup.stop()


def test_runnerq_events_whose_hashes_lie_on_a_killed_primary_wait_for_its_replica(
    own_cluster, run_exporter
):
    """The node of some activity hashes dies as their events arrive: the batch is not applied
    (no entry refused, no event counted without its type) until the replica took over, then
    every event is counted once with what its hash says."""
    cluster, stream = own_cluster, "default:events_stream"
    settings = {"url": cluster.url, "socket_timeout": 1}
    app = run_exporter({"presets": ["runnerq"], "sources": {"redis": settings}})
    wait_for(lambda: app.health.snapshot()[f"events:{stream}"].up)
    stream_node = cluster.primary_of(stream)
    with cluster.client() as client:
        rq = RunnerQ(client)
        activities = [rq.new("ping", "High", time.time()) for _ in range(30)]
    victim = next(
        cluster.primary_of(f"activity:{a}")
        for a in activities
        if cluster.primary_of(f"activity:{a}") is not stream_node
    )
    on_victim = [a for a in activities if cluster.primary_of(f"activity:{a}") is victim]
    with victim.client() as primary:
        assert primary.execute_command("WAIT", 1, 5000) == 1  # the replica has the hashes
    victim.stop()
    with stream_node.client() as writer:  # the stream's node is alive: the events go in
        for activity in activities:
            RunnerQ(writer).event(activity, "Enqueued", time.time(), None, {"priority": "High"})

    def enqueued() -> float:
        series = scrape_series(app)
        return total(series, "queue_jobs_enqueued_total", system="runnerq", job_type="ping")

    wait_for(lambda: enqueued() == len(activities), timeout=60)
    series = scrape_series(app)
    assert total(series, "queue_jobs_enqueued_total", system="runnerq") == len(activities)
    assert total(series, "queue_exporter_events_invalid_total") == 0
    assert total(series, "queue_exporter_source_errors_total", source=f"events:{stream}") >= 1
    assert on_victim  # some of them waited for the replica


def _leadership(cluster: ClusterSetup, ttl: float, identity: str, clock=time.monotonic):
    config = LeaderElectionConfig(
        enabled=True, lease_ttl=ttl, renew_interval=ttl / 4, identity=identity
    )
    return Leadership(config, RedisConnectionConfig(url=cluster.url, socket_timeout=1), clock)


def test_the_lease_on_a_cluster_is_held_by_one_and_taken_over(empty):
    cluster = empty
    dead, follower = _leadership(cluster, 2.0, "dead"), _leadership(cluster, 2.0, "follower")
    assert dead.renew() and dead.token() == 1
    assert not follower.renew()
    with cluster.client() as client:
        assert client.get(LEASE).decode() == f"1:{dead.holder}"
        # the fencing counter shares the lease's slot: one script touches both
        assert client.get("{" + LEASE + "}:fence") == b"1"
    with cluster.primary_of(LEASE).client() as primary:
        primary.script_flush()  # the script is loaded again
    assert dead.renew() and dead.token() == 1
    wait_for(follower.renew, timeout=10, interval=0.05)  # the dead one renews no more
    assert follower.token() == 2
    follower.release()
    with cluster.client() as client:
        assert client.get(LEASE) is None


def _reading(app) -> bool:
    """The BullMQ reader reads the streams itself: up, and not standing by for a leader (a
    follower's reader is up too, and the leader's first read takes the streams' ends as its
    start, so a job finished before that read is never counted)."""
    report = app.health.snapshot().get(NATIVE)
    return report is not None and report.up and not report.standby


@pytest.mark.parametrize(
    ("prefix", "queue"),
    [("bull", QUEUES[0]), (TAGGED_PREFIX, PLAIN_QUEUES[0])],
    ids=["tagged-queue", "tagged-prefix"],
)
def test_runs_on_a_cluster_with_exactly_the_acl_redis_acl_prints(
    empty, run_exporter, prefix, queue
):
    cluster = empty
    bullmq = BullMQ(BULLMQ_MAJORS[-1], 0, cluster=_seeds(cluster), prefix=prefix)
    raw = {
        "presets": [{"name": "bullmq", "params": {"prefix": prefix}}, "runnerq"],
        "leader_election": {"enabled": True, "lease_ttl": 2, "renew_interval": 0.5},
        "sources": {
            "redis": {"url": cluster.url, "username": "exporter", "password": "acl-secret-2"}
        },
    }
    rules = redis_acl.acl_rules(config_module.from_dict(raw))
    for node in cluster.nodes:
        with node.client() as client:
            client.execute_command(
                "ACL", "SETUSER", "exporter", "reset", "on", ">acl-secret-2", *rules
            )
            client.execute_command("ACL", "LOG", "RESET")
    try:
        bullmq.steps({"op": "add", "queue": queue, "name": "first"})
        app = run_exporter(raw)
        wait_for(lambda: _reading(app))
        bullmq.steps({"op": "work", "queue": queue, "completed": 1})
        day = _DayOnACluster()
        entries = _run_day(RunnerQ(day), time.time() - 100)
        with cluster.client() as client:
            day.replay(client)
        assert_the_day(wait_for_the_day(app, entries))

        def completed() -> float:
            series = scrape_series(app)
            return total(series, "queue_jobs_completed_total", system="bullmq", queue=queue)

        def sampled() -> float:
            series = scrape_series(app)
            return total(series, "queue_depth", system="bullmq", queue=queue, state="completed")

        wait_for(lambda: completed() == 1 and sampled() == 1)
        assert app.leadership is not None and app.leadership.is_leader()
        snapshot = app.health.snapshot()
        assert all(report.up for report in snapshot.values()), snapshot
        assert all(report.errors == {} for report in app.health.key_groups())
        for node in cluster.nodes:  # not one command refused, not even one a client ignores
            with node.client() as client:
                assert client.execute_command("ACL", "LOG") == [], node.port
    finally:
        bullmq.stop_all()
        for node in cluster.nodes:
            with node.client() as client:
                client.execute_command("ACL", "DELUSER", "exporter")


def test_bullmq_queue_whose_slot_moved_is_read_at_its_new_node(empty, run_exporter):
    """Every key of one queue migrated to another primary, the slot handed over: the reader's
    MULTI there meets MOVED, that read fails, the next reads the slot map again and goes on
    from the stored positions, every job counted once. (Runs last: it moves a slot.)"""
    cluster, queue = empty, QUEUES[0]
    bullmq = BullMQ(BULLMQ_MAJORS[-1], 0, cluster=_seeds(cluster))
    try:
        bullmq.steps({"op": "add", "queue": queue, "name": "first"})
        app = run_exporter({"presets": ["bullmq"], "sources": {"redis": {"url": cluster.url}}})
        wait_for(lambda: _reading(app))
        bullmq.steps({"op": "work", "queue": queue, "completed": 1})
        wait_for(lambda: _bullmq_settled(app, bullmq.truth([queue])["queues"]))
        _move_slot(cluster, f"bull:{queue}:events")
        bullmq.steps(
            {"op": "add", "queue": queue, "name": "ok", "count": 3},
            {"op": "work", "queue": queue, "completed": 3},
        )
        truth = bullmq.truth([queue])["queues"]
        assert truth[queue]["counts"]["completed"] == 4
        wait_for(lambda: _bullmq_settled(app, truth), timeout=30)
        series = scrape_series(app)
        assert total(series, "queue_jobs_enqueued_total", system="bullmq", queue=queue) == 3
        assert total(series, "queue_exporter_events_lost_total", stream=NATIVE) == 0
        # the MOVED met, counted as the read it failed
        assert total(series, "queue_exporter_source_errors_total", source=NATIVE) >= 1, {
            key: number for key, number in series.items() if key[0].endswith("errors_total")
        }
    finally:
        bullmq.stop_all()


def _move_slot(cluster: ClusterSetup, key: str) -> None:
    """Every key of `key`'s slot MIGRATEd to another primary, then the slot assigned to it."""
    source = cluster.primary_of(key)
    target = next(
        node
        for node in cluster.nodes
        if node != source and node.client().info("replication")["role"] == "master"
    )
    with source.client() as src, target.client() as dst:
        slot = src.cluster("KEYSLOT", key)
        source_id, target_id = src.cluster("MYID").decode(), dst.cluster("MYID").decode()
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 10_000)
        src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)
        for node in (dst, src):
            node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    assert cluster.primary_of(key) == target


def test_the_lease_is_kept_through_its_primary_killed(empty):
    """The lease's primary dies; once its replica took over, the leader renews there under the
    same token and no follower gets in. (Runs last: it kills a primary for good.)"""
    cluster, clock = empty, FakeClock()
    leader = _leadership(cluster, 30.0, "leader", clock)
    follower = _leadership(cluster, 30.0, "other")
    assert leader.renew() and leader.token() == 1
    victim = cluster.primary_of(LEASE)
    with victim.client() as primary:
        assert primary.execute_command("WAIT", 1, 5000) == 1  # the replica has the lease
    victim.stop()
    assert leader.is_leader()  # within the lease it renewed before
    # Past that lease by the leader's own clock (Redis keeps it 30 s): renew() is True now
    # only for a renewal that succeeded, on the promoted replica.
    clock.now += 31
    assert not leader.is_leader()
    wait_for(leader.renew, timeout=60, interval=0.2)
    assert leader.token() == 1
    assert not follower.renew()
    survivor = next(node for node in cluster.nodes if node is not victim)
    with RedisCluster(host="127.0.0.1", port=survivor.port) as client:
        assert client.get_node_from_key(LEASE).port != victim.port
        assert client.get(LEASE).decode() == f"1:{leader.holder}"
