"""A real Redis Cluster (3 primaries, 3 replicas): every primary scanned, keys read on their
slot's node, a BullMQ-style hash-tagged prefix, and a primary killed mid-cycle; an events
stream consumed on its slot's primary, and through that primary killed; all of it over TLS.
A slot being migrated: the keys already moved are read where ASK sends them, in the same cycle
as the keys not yet moved."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from redis.exceptions import RedisClusterException

from exporter.commands import redis_acl
from exporter.config import settings as config_module
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.redis_keys.sampler import RedisKeySampler
from tests.conftest import scrape_series, value, wait_for
from tests.redis_topology import ClusterSetup, eventually
from tests.tls_certs import make_pki

INTERVAL = 0.3
# A cycle deadline for the tests about nodes and slots, not about deadlines: the default (the
# interval) timed cycles out on a loaded machine, withdrawing every series at random moments.
UNHURRIED = 10.0
PRIORITIES = [str(number) for number in range(1, 10)]
SPREAD = {
    "system": "spread",
    "pattern": "jobs:{queue}:p{_p}",
    "type": "list",
    "state": "pending",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    setup = ClusterSetup(tmp_path_factory.mktemp("cluster")).start()
    yield setup
    setup.stop()


def _write(cluster: ClusterSetup) -> dict[str, int]:
    """Queues whose priority lists land on every node; BullMQ queues under hash tags."""
    expected = {}
    with cluster.client() as client:
        client.flushall(target_nodes="primaries")
        for queue in ("email", "sms", "push"):
            for priority in PRIORITIES:
                client.rpush(f"jobs:{queue}:p{priority}", *["x"] * int(priority))
            expected[queue] = sum(map(int, PRIORITIES))
        for number, queue in enumerate(("{emails}", "{reports}", "{images}")):
            client.hset(f"bull:{queue}:meta", "opts.maxLenEvents", "10000")
            for job in range(number + 2):
                client.hset(f"bull:{queue}:{job}", mapping={"timestamp": 1_000_000, "name": "t"})
                client.lpush(f"bull:{queue}:wait", str(job))
            expected[queue] = number + 2
    return expected


def _nodes_of(cluster: ClusterSetup, keys: list[str]) -> set[int]:
    return {cluster.primary_of(key).port for key in keys}


def test_read_from_replica_scans_and_reads_on_replicas(cluster, run_exporter):
    expected = _write(cluster)
    primaries = [
        node for node in cluster.nodes if node.client().info("replication")["role"] == "master"
    ]
    replicas = [node for node in cluster.nodes if node not in primaries]
    for node in cluster.nodes:
        with node.client() as client:
            client.config_resetstat()
    settings = {"url": cluster.url, "read_from": "replica", "key_groups": [SPREAD]}
    app = run_exporter({"sample_interval": INTERVAL, "sources": {"redis": settings}})

    def spread(series):
        return {
            dict(labels)["queue"]: number
            for (name, labels), number in series.items()
            if name == "queue_depth" and dict(labels)["system"] == "spread"
        }

    wanted = {queue: expected[queue] for queue in ("email", "sms", "push")}
    wait_for(lambda: spread(scrape_series(app)) == wanted)

    def calls(node, command):
        with node.client() as client:
            stats = client.info("commandstats").get(f"cmdstat_{command}", {})
        return int(stats.get("calls", 0))

    assert all(calls(node, "scan") > 0 for node in replicas)
    assert sum(calls(node, "llen") for node in replicas) >= 27
    assert all(calls(node, "scan") == calls(node, "llen") == 0 for node in primaries)


MIGRATING = {  # every key of queue {orders} in one slot, by its hash tag
    "system": "migrating",
    "pattern": "orders:{queue}:p{_p}",
    "type": "list",
    "state": "pending",
    "oldest": {"time_in": "json", "field": "at"},
}
BY_HASH = {  # the head item names a job hash, in the same slot
    "system": "by_hash",
    "pattern": "jobs:{queue}:wait",
    "type": "list",
    "state": "pending",
    "oldest": {"time_in": "hash", "hash_key": "jobs:{queue}:job:{item}", "field": "at"},
}


def _move(source, target, slot: int, keys: list[str]) -> None:
    """The slot in migration from source to target (IMPORTING, MIGRATING), these keys moved."""
    with source.client() as src, target.client() as dst:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src.cluster("MYID").decode())
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst.cluster("MYID").decode())
        src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *keys)


def _finish_move(source, target, slot: int) -> None:
    """The rest of the slot's keys moved and the slot given to the target, as resharding ends."""
    with source.client() as src, target.client() as dst:
        left = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
        if left:
            src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *left)
        for node in (dst, src):
            node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst.cluster("MYID").decode())


def test_a_slot_in_migration_is_read_whole_following_ask(cluster):
    """Half of a migrating slot's keys moved: LLEN meets ASK, the item reads meet it inside
    their script; each goes to the importing node after ASKING, the head item's job hash too
    (a follow-up of a follow-up), and the keys not moved are read at the source, all in one
    cycle, with no error and no key group withdrawn."""
    with cluster.client() as client:
        client.flushall(target_nodes="primaries")
        for priority in range(1, 7):
            at = 1_000_000 + priority
            items = [f'{{"at": {at + n}}}' for n in range(priority)]
            client.rpush(f"orders:{{orders}}:p{priority}", *items)
        client.rpush("jobs:{orders}:wait", "7", "8")
        client.hset("jobs:{orders}:job:7", "at", 2_000_000)
        client.hset("jobs:{orders}:job:8", "at", 3_000_000)
    source = cluster.primary_of("orders:{orders}:p1")
    target = next(
        node
        for node in cluster.nodes
        if node != source and node.client().info("replication")["role"] == "master"
    )
    with source.client() as client:
        slot = client.cluster("KEYSLOT", "{orders}")
    moved = ["orders:{orders}:p1", "orders:{orders}:p2", "jobs:{orders}:wait"]
    _move(source, target, slot, [*moved, "jobs:{orders}:job:7"])
    settings = {"url": cluster.url, "username": "sampler", "password": "acl-secret-2"}
    config = config_module.from_dict(
        {"sources": {"redis": {**settings, "key_groups": [MIGRATING, BY_HASH]}}}
    )
    rules = redis_acl.acl_rules(config)
    for node in cluster.nodes:  # with exactly the rules redis-acl prints: ASKING among them
        with node.client() as client:
            client.execute_command(
                "ACL", "SETUSER", "sampler", "reset", "on", ">acl-secret-2", *rules
            )
            client.acl_log_reset()
    redis_source = config.sources.default_redis()
    assert redis_source is not None
    sampler = RedisKeySampler(redis_source, 15.0)
    try:
        for node, keys in ((source, 5), (target, 4)):  # ASK at the source for the keys moved
            with node.client() as client:
                assert client.cluster("COUNTKEYSINSLOT", slot) == keys
        for _ in range(2):  # and the next cycle likewise: ASK needs no new slot map
            cycle = sampler.sample()
            samples = {spec.name: dict(part.items()) for spec, part in cycle.samples.metrics()}
            now = time.time()
            depths, ages = samples["queue_depth"], samples["queue_oldest_age_seconds"]
            assert depths == {
                ("migrating", "{orders}", "", "pending"): 21.0,
                ("by_hash", "{orders}", "", "pending"): 2.0,
            }
            # the oldest head of the six lists is p1's (moved); the job hash it names moved too
            assert abs(ages[("migrating", "{orders}", "", "pending")] - (now - 1_000_001)) < 60
            assert abs(ages[("by_hash", "{orders}", "", "pending")] - (now - 2_000_000)) < 60
            assert [report.errors for report in cycle.key_groups or []] == [{}, {}]
        for node in cluster.nodes:
            with node.client() as client:
                assert client.acl_log() == []  # nothing refused
    finally:
        sampler.close()
        _finish_move(source, target, slot)
        for node in cluster.nodes:
            with node.client() as client:
                client.execute_command("ACL", "DELUSER", "sampler")


def test_runs_with_exactly_the_acl_redis_acl_prints(cluster, run_exporter):
    expected = _write(cluster)
    with cluster.client() as writer:
        for number in range(3):
            _emit(writer, number)
    raw = {
        "presets": [{"name": "bullmq", "params": {"native": False}}],
        "sources": {
            "redis": {
                "url": cluster.url,
                "username": "exporter",
                "password": "acl-secret-1",
                "read_from": "replica",
                "key_groups": [SPREAD],
            },
            "events": _stream_from_start(),
        },
    }
    rules = redis_acl.acl_rules(config_module.from_dict(raw))
    assert "+cluster|slots" in rules and "+readonly" in rules and "+asking" in rules
    for node in cluster.nodes:
        with node.client() as client:
            client.execute_command(
                "ACL", "SETUSER", "exporter", "reset", "on", ">acl-secret-1", *rules
            )
    try:
        app = run_exporter({"sample_interval": INTERVAL, **raw})
        wait_for(lambda: _pending(scrape_series(app)) == expected)
        wait_for(lambda: _completed(scrape_series(app)) == 3)  # the stream's consumer too
        assert all(report.errors == {} for report in app.health.key_groups())
    finally:
        for node in cluster.nodes:
            with node.client() as client:
                client.execute_command("ACL", "DELUSER", "exporter")


def _pending(series):
    return {
        dict(labels)["queue"]: number
        for (name, labels), number in series.items()
        if name == "queue_depth" and dict(labels)["state"] == "pending"
    }


def test_sampling_reads_every_primary_and_survives_a_primary_killed(cluster, run_exporter):
    expected = _write(cluster)
    victim_port = cluster.primary_of("jobs:email:p1").port
    pinned = next(
        name
        for name in map(str, range(100))
        if cluster.primary_of(f"pinned:{name}").port != victim_port
    )
    with cluster.client() as client:
        client.rpush(f"pinned:{pinned}", "x")
    expected[pinned] = 1
    by_value = {
        **SPREAD,
        "system": "pinned",
        "pattern": "pinned:{queue}",
        "values": {"queue": [pinned]},
    }
    spread_keys = [f"jobs:email:p{p}" for p in PRIORITIES]
    assert len(_nodes_of(cluster, spread_keys)) == 3  # one queue's keys on every primary
    app = run_exporter(
        {
            "sample_interval": INTERVAL,
            "presets": [{"name": "bullmq", "params": {"native": False}}],
            "sources": {
                "redis": {
                    "url": cluster.url,
                    "socket_timeout": 1,
                    "cycle_timeout": UNHURRIED,
                    "key_groups": [SPREAD, by_value],
                }
            },
        }
    )

    def depths(series):
        return {
            dict(labels)["queue"]: number
            for (name, labels), number in series.items()
            if name == "queue_depth" and dict(labels)["state"] == "pending"
        }

    series = wait_for(lambda: (s := scrape_series(app)) and depths(s) == expected and s)
    age = value(series, "queue_oldest_age_seconds", system="bullmq", queue="{emails}")
    assert age is not None and age > 1_000_000  # read from the job hash on the queue's slot
    reports = {r.pattern: r for r in app.health.key_groups()}
    assert reports[SPREAD["pattern"]].keys_matched == 27
    assert reports[SPREAD["pattern"]].errors == {}

    # Kill the primary of email's first priority list: a spread queue's depth is never served
    # partly summed; once a replica took over, every series is back whole.
    victim = cluster.primary_of("jobs:email:p1")
    victim.stop()

    def down_but_up():
        # Source up: the other primaries answered. Read together, in one wait: the scrape and
        # the key group's report each come from whichever cycle was last when they were read.
        series = scrape_series(app)
        reports = {r.pattern: r.errors for r in app.health.key_groups()}
        node_down = reports.get(SPREAD["pattern"], {}).get("node_down") == 1
        up = value(series, "queue_exporter_source_up", source="redis") == 1
        return series if up and node_down and "email" not in depths(series) else None

    while_down = eventually(down_but_up)
    assert depths(while_down).get(pinned) == 1  # a queue named by value on a live node stays
    seen_while_down = []

    def back_whole():
        found = depths(scrape_series(app))
        seen_while_down.append(found.get("email"))
        return found == expected

    eventually(back_whole, timeout=60)
    assert all(depth in (None, expected["email"]) for depth in seen_while_down)
    assert None in seen_while_down  # withdrawn while its node was down
    node_down = [r for r in app.health.key_groups() if r.errors.get("node_down")]
    assert node_down == []  # the last cycle had every node


STREAM = "events:{billing}"


def _completed(series):
    return value(series, "queue_jobs_completed_total", system="billing", queue="q")


def _stream_from_start() -> dict:
    return {"streams": [{"key": STREAM, "start": "0"}], "block_ms": 100}


def _sampled_and_consumed(url: str) -> dict:
    """Keys sampled and STREAM consumed on the cluster at `url`, with a 1 s socket timeout."""
    sampled = {"url": url, "socket_timeout": 1, "key_groups": [SPREAD]}
    return {
        "sample_interval": INTERVAL,
        "sources": {"redis": sampled, "events": _stream_from_start()},
    }


def _emit(client, number: int) -> None:
    fields = {"v": "1", "event": "completed", "ts": f"{time.time():.3f}", "system": "billing"}
    fields |= {"queue": "q", "job_id": f"j{number}", "job_type": "t", "runtime": "0.1"}
    client.xadd(STREAM, fields)


@pytest.fixture
def own_cluster(tmp_path):
    """A cluster of its own: the test kills a primary for good."""
    setup = ClusterSetup(tmp_path).start()
    yield setup
    setup.stop()


def test_a_stream_is_consumed_on_its_slot_and_through_its_primary_killed(own_cluster, run_exporter):
    """Every command of the consumer goes to the primary of the stream's slot; once that
    primary is killed and its replica promoted, consuming goes on there, every event the
    stream holds counted once, though acks and the group's position may not have reached the
    replica (the consumer re-reads them as its own pending and does not count them again)."""
    writer = own_cluster.client()
    for number in range(50):
        _emit(writer, number)
    victim = own_cluster.primary_of(STREAM)
    app = run_exporter(_sampled_and_consumed(own_cluster.url))
    wait_for(lambda: _completed(scrape_series(app)) == 50)
    with victim.client() as client:
        group = client.xinfo_groups(STREAM)[0]
    assert group["entries-read"] == 50 and group["pending"] == 0  # read and acked there

    produced = [50]
    paused, idle, stop = threading.Event(), threading.Event(), threading.Event()

    def produce() -> None:
        while not stop.is_set():
            if paused.is_set():
                idle.set()  # no write in flight: every one made so far was acknowledged
                stop.wait(0.01)
                continue
            idle.clear()
            try:
                _emit(writer, produced[0])
                produced[0] += 1
            except (redis.RedisError, RedisClusterException):
                stop.wait(0.05)  # the slot's primary is changing

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        wait_for(lambda: _completed(scrape_series(app)) > produced[0] - 40 > 20)
        # Every event written so far is on the replica (WAIT): none is lost with the primary,
        # so the stream the new primary holds is exactly what was written.
        paused.set()
        assert idle.wait(timeout=30)  # the write in flight, if any, acknowledged (no sleep)
        with victim.client() as client:
            assert client.execute_command("WAIT", 1, 5000) == 1
        victim.stop()
        written_before = produced[0]
        paused.clear()
        promoted = eventually(
            lambda: (node := own_cluster.primary_of(STREAM)) != victim and node, timeout=60
        )
        wait_for(lambda: produced[0] >= written_before + 20, timeout=30)  # on the new primary
    finally:
        stop.set()
        producer.join()
    with promoted.client() as client:
        in_stream = client.xlen(STREAM)
    assert in_stream == produced[0]  # every acknowledged write is in the stream
    eventually(lambda: _completed(scrape_series(app)) == in_stream, timeout=60)
    time.sleep(INTERVAL * 5)  # and it stays so: nothing counted twice later
    assert _completed(scrape_series(app)) == in_stream
    with promoted.client() as client:
        eventually(lambda: client.xinfo_groups(STREAM)[0]["pending"] == 0)  # all acked there
    writer.close()


def test_a_tls_cluster_is_sampled_and_its_stream_consumed(tmp_path, run_exporter):
    """rediss+cluster://: the slot map, every node's reads and a stream's consumer all over
    TLS with a client certificate, on nodes that speak nothing else."""
    pki = make_pki(tmp_path / "pki")
    setup = ClusterSetup(tmp_path / "cluster", tls=pki.directory).start()
    try:
        with setup.client() as writer:
            for priority in PRIORITIES:
                writer.rpush(f"jobs:email:p{priority}", *["x"] * int(priority))
            for number in range(7):
                _emit(writer, number)
        plain = RedisConnectionConfig(url=setup.url.replace("rediss+", "redis+"), socket_timeout=1)
        with pytest.raises(redis.RedisError):  # no plain TCP: what follows used TLS
            plain.connect_for_key(STREAM).ping()
        tls_files = {
            "tls_ca_file": str(pki.path("ca.crt")),
            "tls_cert_file": str(pki.path("client.crt")),
            "tls_key_file": str(pki.path("client.key")),
        }
        app = run_exporter(
            {
                "sample_interval": INTERVAL,
                "sources": {
                    "redis": {"url": setup.url, **tls_files, "key_groups": [SPREAD]},
                    "events": _stream_from_start(),
                },
            }
        )

        def email_depth(series):
            return value(series, "queue_depth", system="spread", queue="email")

        series = wait_for(
            lambda: (s := scrape_series(app)) and _completed(s) == 7 and email_depth(s) and s
        )
        assert email_depth(series) == 45
        assert value(series, "queue_exporter_source_up", source="redis") == 1
    finally:
        setup.stop()


def test_a_stream_whose_slot_is_migrated_is_followed_to_its_new_node(own_cluster, run_exporter):
    """The stream's slot is migrated to another primary while events keep coming: the
    consumer's reads meet ASK while the key has moved and the slot not yet, then MOVED; it
    reads the slot map again, goes on at the new node and counts every event once."""
    writer = own_cluster.client()
    for number in range(20):
        _emit(writer, number)
    source = own_cluster.primary_of(STREAM)
    with source.client() as client:
        slot = client.cluster("KEYSLOT", STREAM)
        source_id = client.cluster("MYID").decode()
    target = next(
        node
        for node in own_cluster.nodes
        if node != source and node.client().info("replication")["role"] == "master"
    )
    with target.client() as client:
        target_id = client.cluster("MYID").decode()
    app = run_exporter(_sampled_and_consumed(own_cluster.url))
    wait_for(lambda: _completed(scrape_series(app)) == 20)

    with source.client() as src, target.client() as dst:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", STREAM)
        time.sleep(INTERVAL * 3)  # reads at the source now meet ASK
        for number in range(20, 30):  # written to the target (the client follows ASK)
            _emit(writer, number)
        for node in (dst, src):
            node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
    for number in range(30, 40):
        _emit(writer, number)
    assert own_cluster.primary_of(STREAM) == target
    with target.client() as client:
        in_stream = client.xlen(STREAM)
    assert in_stream == 40
    eventually(lambda: _completed(scrape_series(app)) == in_stream, timeout=60)
    time.sleep(INTERVAL * 5)  # and it stays so
    series = scrape_series(app)
    assert _completed(series) == in_stream
    redirected = value(
        series, "queue_exporter_source_errors_total", source=f"events:{STREAM}", reason="response"
    )
    assert redirected is not None and redirected >= 1  # ASK or MOVED met, counted, followed
    with target.client() as client:
        group = client.xinfo_groups(STREAM)[0]
        assert group["pending"] == 0 and group["entries-read"] == in_stream  # read there
    writer.close()
