"""A Redis Cluster node that hangs holds no other node's reads hostage: each node's next round
goes as soon as its own replies are in (key_rounds.Transport), so every key of the other nodes
is read while the hung node's reply is still awaited. Once that node fails, only the groups
with keys on it are withdrawn, and the source stays up."""

from __future__ import annotations

import threading

import pytest

from exporter.config import settings as config_module
from exporter.output.samples import SampleSet
from exporter.sources.redis_keys.sampler import RedisKeySampler
from exporter.sources.source import SourceReport
from tests.conftest import wait_for
from tests.redis_topology import ClusterSetup
from tests.tcp_proxy import TcpProxy

KEYS = 1800  # about 600 per primary: twelve SCAN pages of 50 on each
SCANNED = {"system": "scanned", "pattern": "flow:{queue}", "type": "list", "state": "pending"}


@pytest.fixture
def cluster(tmp_path):
    """A cluster of its own: one primary is reached through a proxy the test freezes."""
    setup = ClusterSetup(tmp_path).start()
    yield setup
    setup.stop()


def _llen_calls(node) -> int:
    with node.client() as client:
        stats = client.info("commandstats").get("cmdstat_llen", {})
    return int(stats.get("calls", 0))


def _behind_proxy(cluster: ClusterSetup, node) -> TcpProxy:
    """Clients reach `node` through a proxy: it announces the proxy's port, and every node's
    slot map says so before this returns."""
    proxy = TcpProxy("127.0.0.1", node.port).start()
    with node.client() as client:
        client.config_set("cluster-announce-port", proxy.port)

    def announced() -> bool:
        for each in cluster.nodes:
            with each.client() as client:
                ports = {shard[2][1] for shard in client.execute_command("CLUSTER", "SLOTS")}
            if proxy.port not in ports:
                return False
        return True

    wait_for(announced, timeout=30)
    return proxy


def _depths(samples: SampleSet) -> dict:
    return {spec.name: dict(part.items()) for spec, part in samples.metrics()}["queue_depth"]


def test_a_hung_node_holds_no_other_nodes_reads_hostage(cluster):
    primaries = [
        node for node in cluster.nodes if node.client().info("replication")["role"] == "master"
    ]
    hung, others = primaries[0], primaries[1:]
    pinned = next(
        name for name in map(str, range(100)) if cluster.primary_of(f"pinned:{name}") != hung
    )
    with cluster.client() as client:
        for number in range(KEYS):
            client.rpush(f"flow:q{number}", "x")
        client.rpush(f"pinned:{pinned}", "x", "y")
    proxy = _behind_proxy(cluster, hung)
    by_value = {**SCANNED, "system": "pinned", "pattern": "pinned:{queue}"}
    by_value["values"] = {"queue": [pinned]}
    settings = {"url": cluster.url, "socket_timeout": 120, "cycle_timeout": 300}
    settings |= {"scan_count": 50, "pipeline_size": 50, "key_groups": [SCANNED, by_value]}
    config = config_module.from_dict({"sources": {"redis": settings}})
    source = config.sources.default_redis()
    assert source is not None
    sampler = RedisKeySampler(source, 15.0)
    try:
        warm = sampler.sample().samples  # every node's connection made, the proxy's included
        assert len(_depths(warm)) == KEYS + 1
        keys_on = {}
        for node in others:
            with node.client() as client:
                keys_on[node.port] = sum(1 for _ in client.scan_iter(match="flow:*", count=1000))
                client.config_resetstat()
        assert all(keys_on.values())

        proxy.freeze()  # the node hangs: its connections open, nothing answered
        result: list[SourceReport] = []
        cycle = threading.Thread(target=lambda: result.append(sampler.sample()), daemon=True)
        cycle.start()
        # Every key of the other nodes is read (and `pinned`, by value), the hung one awaited.
        wait_for(lambda: all(_llen_calls(node) >= keys_on[node.port] for node in others))
        assert cycle.is_alive()
        proxy.cut()  # the node's connections break: the cycle goes on without it
        cycle.join(timeout=60)
        assert not cycle.is_alive()
    finally:
        sampler.close()
        proxy.cut()

    assert _depths(result[0].samples) == {
        ("pinned", pinned, "", "pending"): 2.0
    }  # the scanned group withdrawn
    reports = {report.pattern: report.errors for report in result[0].key_groups or []}
    assert reports == {SCANNED["pattern"]: {"node_down": 1}, by_value["pattern"]: {}}
