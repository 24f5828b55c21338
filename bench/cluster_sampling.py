"""A key sampling cycle over a 3-primary Redis Cluster against the same keys on one server, each
against the raw-hiredis floor doing the same work there, in the same run.

    .venv/bin/python bench/cluster_sampling.py [--keys 1000000] [--runs 3]

The same `--keys` orchestrata queue lists (one JSON item each) on a redis-server of the
benchmark's own and on a cluster of three primaries and three replicas (redis-server
--cluster-enabled, redis-cli --cluster create). On each:
- floor: bench/key_sampling.py's leanest loop (SCAN MATCH of the preset's two patterns, each SCAN
  sent with the reads of the keys the previous one found, LLEN and the head item in the
  exporter's bounded read-only script, over a raw socket with hiredis, every head's JSON and
  ISO time parsed); on the cluster one such loop per primary, each on a socket and thread of
  its own, all at once (the script as the exporter sends it to a cluster node);
- exporter: one full cycle of the orchestrata preset in its default configuration.
After a warm-up of each, checked to find the same keys, depths and ages (and the cluster's floor
the one server's keys), the four run interleaved `--runs` times; medians. Printed: wall time of
each, the exporter against the floor on each, the cluster against the one server for both, and
the Redis CPU one cycle costs (INFO CPU used_cpu_user + used_cpu_sys deltas) on the one server
and on each primary; the same comparisons by CPU (this process's threads and the servers'), the
steadier figure on a shared host.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.key_sampling import Found, RawRedis, floor_loop, load_average, same_result
from exporter.config import settings as config_module
from exporter.sources.redis_keys.sampler import RedisKeySampler
from tests.private_redis import PrivateRedis
from tests.redis_topology import ClusterSetup

ITEM = json.dumps({"packet": {"n": 1}, "queued_at": "2026-11-29T18:00:00+00:00", "priority": 2})
BATCH = 5000
SIDES = ("one server", "cluster")


# A speed benchmark of every key: the memory cap of a cycle (the source's max_keys) lifted.
EVERY_KEY = 10**9


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
        {"presets": ["orchestrata"], "sources": {"redis": {"url": url, "max_keys": EVERY_KEY}}}
    )
    source = config.sources.default_redis()
    assert source is not None
    return RedisKeySampler(source, 15.0)


class ClusterFloor:
    """The floor over a cluster: a raw socket per primary, each primary's loop in its own
    thread, all at once; the keys found are theirs together."""

    def __init__(self, urls: list[str]) -> None:
        self.raws = [RawRedis(url) for url in urls]
        self.pool = ThreadPoolExecutor(len(urls))

    def run(self) -> Found:
        found: Found = {}
        for part in self.pool.map(lambda raw: floor_loop(raw, any_slot=True), self.raws):
            found.update(part)
        return found

    def close(self) -> None:
        self.pool.shutdown()
        for raw in self.raws:
            raw.close()


def cpu_seconds(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class Clock:
    """Per named run: wall time, the Redis CPU it cost on each server it reads, and the CPU it
    cost in all (this process's threads and those servers): the steadier figure on a shared
    host."""

    def __init__(self) -> None:
        self.wall: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}
        self.redis_cpu: dict[tuple[str, str], list[float]] = {}

    def time(self, name: str, servers: dict[str, redis.Redis], action: Callable[[], Any]) -> Any:
        before = {server: cpu_seconds(client) for server, client in servers.items()}
        started, cpu = time.perf_counter(), time.process_time()
        result = action()
        self.wall.setdefault(name, []).append(time.perf_counter() - started)
        total = time.process_time() - cpu
        for server, client in servers.items():
            spent = cpu_seconds(client) - before[server]
            self.redis_cpu.setdefault((name, server), []).append(spent)
            total += spent
        self.cpu.setdefault(name, []).append(total)
        return result

    def median_wall(self, name: str) -> float:
        return statistics.median(self.wall[name])

    def median_total_cpu(self, name: str) -> float:
        return statistics.median(self.cpu[name])

    def median_cpu(self, name: str, server: str) -> float:
        return statistics.median(self.redis_cpu[name, server])


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
    servers = {"one server": {"one server": one}, "cluster": primaries}
    exporters = {"one server": sampler(single.url), "cluster": sampler(cluster.url)}
    floors = {
        "one server": RawRedis(single.url),
        "cluster": ClusterFloor([f"redis://{name}" for name in primaries]),
    }
    floor_runs: dict[str, Callable[[], Found]] = {
        "one server": lambda: floor_loop(floors["one server"]),
        "cluster": floors["cluster"].run,
    }
    gc.freeze()  # as `serve` does once start-up is done (exporter/runtime/app.py)
    loads = [load_average()]
    started = time.time()
    found = floor_runs["one server"]()  # the warm-ups, and the checks that all agree
    depths = {key: depth for key, (depth, _) in found.items()}
    on_cluster = {key: depth for key, (depth, _) in floor_runs["cluster"]().items()}
    if len(found) != len(keys) or on_cluster != depths:
        raise RuntimeError("the floors found other keys or depths on the cluster and one server")
    for side in SIDES:
        same_result(found, exporters[side].sample().samples, time.time() - started + 1)
    clock = Clock()
    for _ in range(runs):
        for side in SIDES:
            clock.time(f"floor, {side}", servers[side], floor_runs[side])
            cycle = clock.time(f"exporter, {side}", servers[side], exporters[side].sample)
            same_result(found, cycle.samples, time.time() - started + 1)
    loads.append(load_average())
    report(clock, servers, len(keys), runs, loads)
    for exporter in exporters.values():
        exporter.close()
    floors["cluster"].close()
    floors["one server"].close()


def report(clock: Clock, servers: dict[str, Any], keys: int, runs: int, loads: list[str]) -> None:
    print(f"{keys} queue keys, {runs} interleaved rounds (medians), load {' -> '.join(loads)}")
    print(f"{'':>22} {'one server':>10} {'cluster':>10} {'cluster/one':>12}")
    for kind, median in (("wall", clock.median_wall), ("CPU", clock.median_total_cpu)):
        for who in ("floor", "exporter"):
            one, cluster = (median(f"{who}, {side}") for side in SIDES)
            print(f"{f'{who} {kind} s':>22} {one:10.3f} {cluster:10.3f} {cluster / one:11.2f}x")
        ratios = [median(f"exporter, {side}") / median(f"floor, {side}") for side in SIDES]
        print(f"{f'exporter / floor, {kind}':>22} {ratios[0]:9.2f}x {ratios[1]:9.2f}x")
    for who in ("floor", "exporter"):
        for side in SIDES:
            spent = ", ".join(
                f"{clock.median_cpu(f'{who}, {side}', server):.3f}" for server in servers[side]
            )
            per = "per primary" if side == "cluster" else ""
            print(f"Redis CPU s per cycle, {who}, {side} {per}: {spent}")


if __name__ == "__main__":
    main()
