"""A key sampling cycle over a 3-primary Redis Cluster against the same keys on one server.

    .venv/bin/python bench/cluster_sampling.py [--keys 1000000] [--runs 3]

Both run the exporter in its default configuration (the orchestrata preset, one queue list
with one JSON item per key): one redis-server of the benchmark's own, and a cluster of three
primaries and three replicas (redis-server --cluster-enabled, redis-cli --cluster create)
holding the same keys. After a warm-up cycle of each, checked to find the same series and
depths, cycles run interleaved (one server, then the cluster) `--runs` times; medians.
Printed: the cycle's wall time on each and the ratio (cluster / one server: below 1 when the
nodes' round trips in parallel beat one server's), and the Redis CPU one cycle costs on each
server (INFO CPU used_cpu_user + used_cpu_sys deltas), per cluster primary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter import config as config_module
from exporter.health import HealthBoard
from exporter.samples import SampleSet
from exporter.sources.redis_keys import RedisKeySampler
from exporter.telemetry import Telemetry
from tests.private_redis import PrivateRedis
from tests.redis_topology import ClusterSetup

ITEM = json.dumps({"packet": {"n": 1}, "queued_at": "2026-11-29T18:00:00+00:00", "priority": 2})
BATCH = 5000


def key_names(count: int) -> list[str]:
    return [f"orchestrata:queue:recipient-{index}:p{index % 6}" for index in range(count)]


def load(clients_by_slot: Any, keys: list[str]) -> None:
    """RPUSH each key on the client `clients_by_slot(slot)` names, pipelined per client."""
    pipes: dict[int, Any] = {}
    pending: dict[int, int] = {}
    for key in keys:
        client = clients_by_slot(key_slot(key.encode()))
        pipe = pipes.setdefault(id(client), client.pipeline(transaction=False))
        pipe.rpush(key, ITEM)
        pending[id(client)] = pending.get(id(client), 0) + 1
        if pending[id(client)] >= BATCH:
            pipe.execute()
            pending[id(client)] = 0
    for pipe in pipes.values():
        pipe.execute()


def sampler(url: str) -> RedisKeySampler:
    config = config_module.from_dict(
        {"presets": ["orchestrata"], "sources": {"redis": {"url": url}}}
    )
    source = config.sources.default_redis()
    assert source is not None
    return RedisKeySampler(source, Telemetry(HealthBoard()), 15.0)


def depths(samples: SampleSet) -> dict[tuple[str, ...], float]:
    return next(
        dict(series.items()) for spec, series in samples.metrics() if spec.name == "queue_depth"
    )


def cpu_seconds(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    keys = key_names(args.keys)
    with tempfile.TemporaryDirectory() as directory:
        single = PrivateRedis(Path(directory) / "single")
        (Path(directory) / "single").mkdir()
        single.start()
        cluster = ClusterSetup(Path(directory)).start()
        try:
            run(single, cluster, keys, args.runs)
        finally:
            cluster.stop()
            single.stop()


def run(single: PrivateRedis, cluster: ClusterSetup, keys: list[str], runs: int) -> None:
    one = single.client()
    load(lambda _: one, keys)
    with cluster.client() as client:
        primaries = {
            node.name: client.get_redis_connection(node) for node in client.get_primaries()
        }
        owners = {slot: client.nodes_manager.slots_cache[slot][0].name for slot in range(16384)}
        load(lambda slot: primaries[owners[slot]], keys)
    servers = {"one server": [one], **{f"primary {name}": [c] for name, c in primaries.items()}}
    on_one, on_cluster = sampler(single.url), sampler(cluster.url)
    expected = depths(on_one.sample())  # the warm-ups, and the check that both agree
    found = depths(on_cluster.sample())
    if found != expected or sum(expected.values()) != len(keys):
        raise RuntimeError(f"the cluster found {sum(found.values())} items, one server {len(keys)}")
    wall: dict[str, list[float]] = {"one server": [], "cluster": []}
    cpu: dict[str, list[float]] = {name: [] for name in servers}
    for _ in range(runs):
        for name, source, measured in (
            ("one server", on_one, ["one server"]),
            ("cluster", on_cluster, [n for n in servers if n.startswith("primary")]),
        ):
            before = {n: cpu_seconds(servers[n][0]) for n in measured}
            started = time.perf_counter()
            if depths(source.sample()) != expected:
                raise RuntimeError(f"{name}: a cycle found other depths")
            wall[name].append(time.perf_counter() - started)
            for n in measured:
                cpu[n].append(cpu_seconds(servers[n][0]) - before[n])
    one_wall, cluster_wall = (statistics.median(wall[n]) for n in ("one server", "cluster"))
    load_average = Path("/proc/loadavg").read_text().split()[0]
    print(f"{len(keys)} queue keys, {runs} interleaved cycles each (medians), load {load_average}")
    print(f"cycle wall time: one server {one_wall:.2f} s, cluster {cluster_wall:.2f} s")
    print(f"ratio cluster / one server: {cluster_wall / one_wall:.2f}x")
    for name, spent in cpu.items():
        print(f"Redis CPU per cycle, {name}: {statistics.median(spent):.2f} s")
    on_one.close()
    on_cluster.close()


if __name__ == "__main__":
    main()
