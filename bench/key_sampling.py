"""Key sampling cost, as ratios against the leanest loop doing the same work, in the same run.

    .venv/bin/python bench/key_sampling.py [--sizes 10000,100000] [--unrelated 100000]
        [--runs 5] [--peer-up-to 100000] [--plot docs/key-sampling.png]
        [--one-way-ms 0.1,0.25] [--delayed-runs 3] [--delayed-peer-up-to 10000]

For each size: N Orchestrata queue lists (one JSON item each) among `--unrelated` other keys,
in a redis-server of the benchmark's own. After a warm-up of each, the floor, the exporter and
(up to `--peer-up-to` keys) the Go peer run in turn `--runs` times (medians); each is timed by
the clock and by the CPU it costs, this process's and the redis-server's together (the steadier
figure on a shared host):
- floor: the same useful work in the leanest loop: one SCAN MATCH of the preset's two patterns'
  common prefix, its keys matched against both patterns (as the exporter shares one SCAN among
  key groups: exporter/sources/redis_keys/scans.py), each SCAN sent with the reads of the keys the
  previous one found (as the exporter does), LLEN of
  every key and its head item read inside the same bounded read-only script the exporter uses
  (max_item_bytes), over a raw socket with hiredis packing and parsing, every head's JSON
  parsed (JSONDecoder.raw_decode, as the exporter does) and its ISO-8601 time turned into an
  age; the cyclic GC paused;
- the same floor with each SCAN in a round trip of its own (what overlapping saves);
- exporter: one full cycle of the orchestrata preset in its default configuration, checked to
  find the same keys, depths and ages as the floor;
- redis_exporter: a /metrics scrape of Debian's prometheus-redis-exporter --check-keys over the
  same keys, against the exporter's cycle plus the /metrics render of its result (a full scrape
  against a full scrape: the peer reads the keys when it is scraped).
With --one-way-ms, all three also run through bench/delay_proxy.py (a process of its own in
front of the same redis-server, delaying every chunk each way by that many milliseconds: Redis
across a network, as it is from a pod), after the loopback runs; the round trip through it is
measured and printed, and so is the proxy's own CPU, which is counted on neither side.
With --plot, the loopback wall times against the number of keys go to a PNG (matplotlib).
The /metrics render has its own benchmark: bench/exposition.py.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import hiredis
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.config import settings as config_module
from exporter.output.health import HealthBoard
from exporter.output.telemetry import Telemetry
from exporter.redis.pipeline import bounded_reads, script_read
from exporter.sources.redis_keys.sampler import RedisKeySampler
from exporter.sources.runner import apply_report
from tests.private_redis import PrivateRedis, free_port

# A speed benchmark of every key: the memory cap of a cycle (the source's max_keys) lifted.
EVERY_KEY = 10**9
# The preset's two key groups: queue lists and dead-letter lists (none here, but scanned for).
PRESET_GLOBS = ("orchestrata:queue:*:p*", "orchestrata:dlq:*")
# Both found by one SCAN of their common prefix (as the exporter shares it: sources/redis_keys/scans.py), each
# key it returns matched against both patterns.
SHARED_GLOB = "orchestrata:*"
PRESET_KEYS = re.compile(rb"orchestrata:queue:.+:p.+|orchestrata:dlq:.+", re.DOTALL)
MAX_ITEM_BYTES = 256 * 1024  # the exporter's default max_item_bytes
SCAN_COUNT = 1000  # the exporter's default scan_count
# A head's JSON parsed as the exporter parses it (key_items.head_time): without json.loads's
# checks for bytes and surrounding whitespace, the leanest call of the json module.
parse_document = json.JSONDecoder().raw_decode

Found = dict[bytes, tuple[int, float | None]]  # key -> (depth, age of its head)


@contextmanager
def private_redis() -> Iterator[str]:
    """A redis-server of the benchmark's own (a free port, a temp dir); its URL."""
    with tempfile.TemporaryDirectory() as directory:
        server = PrivateRedis(Path(directory)).start()
        try:
            yield server.url
        finally:
            server.stop()


@contextmanager
def delayed(url: str, one_way: float) -> Iterator[tuple[str, int]]:
    """bench/delay_proxy.py in front of the Redis at `url`: its URL and its process id."""
    parts, port = urlsplit(url), free_port()
    proxy = Path(__file__).with_name("delay_proxy.py")
    target = f"{parts.hostname}:{parts.port}"
    command = [sys.executable, str(proxy), str(port), target, repr(one_way)]
    # its stdin is a pipe from this process: it ends with it, even if this one is killed
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        if process.stdout.readline().strip() != b"ready":
            raise RuntimeError("the delaying proxy did not start")
        yield f"redis://127.0.0.1:{port}{parts.path}", process.pid
    finally:
        process.kill()
        process.wait()


def process_cpu(pid: int) -> float:
    """The CPU seconds a process has used (user and system, /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load_keys(client: redis.Redis, queues: int, unrelated: int) -> None:
    client.flushdb()
    item = json.dumps(
        {
            "packet": {"n": 1},
            "queued_at": "2026-11-29T18:00:00+00:00",
            "priority": 2,
            "recipient": "r",
            "message_id": "m",
        }
    )
    pipe = client.pipeline(transaction=False)
    for index in range(queues):
        pipe.rpush(f"orchestrata:queue:recipient-{index}:p{index % 6}", item)
        if index % 5000 == 4999:
            pipe.execute()
    for index in range(unrelated):
        pipe.set(f"session:{index}", "x")
        if index % 5000 == 4999:
            pipe.execute()
    pipe.execute()


class RawRedis:
    """One socket, hiredis to pack commands and parse replies: nothing between them."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port))
        self.reader = hiredis.Reader()

    def round_trip_time(self, times: int = 200) -> float:
        """The median time of a PING's round trip."""
        durations = []
        for _ in range(times):
            start = time.perf_counter()
            self.pipeline([("PING",)])
            durations.append(time.perf_counter() - start)
        return statistics.median(durations)

    def pipeline(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        self.sock.sendall(b"".join(hiredis.pack_command(command) for command in commands))
        replies: list[Any] = []
        while len(replies) < len(commands):
            reply = self.reader.gets()
            if reply is False:
                self.reader.feed(self.sock.recv(65536))
            else:
                replies.append(reply)
        return replies

    def close(self) -> None:
        self.sock.close()


def floor_loop(raw: RawRedis, overlap: bool = True, any_slot: bool = False) -> Found:
    """Depth and head age of every key of the preset's patterns, in the leanest loop: each
    round trip carries the next SCAN and the reads of the keys the last one found (without
    `overlap`, each SCAN waits for a round trip of its own). `any_slot`: a cluster node, whose
    keys are of several slots (the script as the exporter sends it there)."""
    found: Found = {}
    now = time.time()
    head_read = script_read("LINDEX", 0)
    gc.disable()
    try:
        cursor: Any = b"0"
        keys: list[bytes] = []
        scanning = True
        while scanning or keys:
            scan = [("SCAN", cursor, "MATCH", SHARED_GLOB, "COUNT", SCAN_COUNT)] if scanning else []
            # SCAN may repeat a key
            keys = [key for key in keys if key not in found and PRESET_KEYS.match(key)]
            reads: list[tuple[Any, ...]] = [("LLEN", key) for key in keys]
            if keys:
                reads.append(bounded_reads(keys, [head_read] * len(keys), MAX_ITEM_BYTES, any_slot))
            if overlap:
                replies = raw.pipeline(scan + reads)
                scanned, replies = replies[: len(scan)], replies[len(scan) :]
            else:
                replies = raw.pipeline(reads) if reads else []
                scanned = raw.pipeline(scan) if scan else []
            heads = replies[-1] if keys else []
            for key, depth, head in zip(keys, replies[: len(keys)], heads, strict=True):
                document, _ = parse_document(head.decode())
                queued_at = datetime.fromisoformat(document["queued_at"])
                found[key] = (depth, now - queued_at.timestamp())
            keys = []
            if scanned:
                cursor, keys = scanned[0]
                scanning = cursor != b"0"
    finally:
        gc.enable()
    return found


def same_result(found: Found, samples: Any, seconds_apart: float) -> None:
    """The exporter's cycle saw the floor's keys, depths and head ages (each key is one queue
    and priority here: recipient-<n>:p<m>)."""
    series = {spec.name: dict(part.items()) for spec, part in samples.metrics()}
    depths, ages = series["queue_depth"], series.get("queue_oldest_age_seconds", {})
    expected_depths, expected_ages = {}, {}
    for key, (depth, age) in found.items():
        _, _, queue, priority = key.decode().split(":")
        labels = ("orchestrata", queue, priority.removeprefix("p"), "pending")
        expected_depths[labels] = float(depth)
        if age is not None:
            expected_ages[labels] = age
    if depths != expected_depths:
        raise RuntimeError(f"depths differ: {len(depths)} series against {len(expected_depths)}")
    if ages.keys() != expected_ages.keys():
        raise RuntimeError(f"ages differ: {len(ages)} series against {len(expected_ages)}")
    # both measure against the time they ran: the same head gives the same age, give or take
    # the seconds between the two runs
    if any(abs(ages[labels] - age) > seconds_apart for labels, age in expected_ages.items()):
        raise RuntimeError("ages differ by more than the time between the runs")


class Peer:
    """Debian's prometheus-redis-exporter --check-keys over the queue keys, scraped on demand."""

    def __init__(self, binary: str, url: str) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [
                binary,
                f"-redis.addr={url}",
                f"-check-keys={','.join(PRESET_GLOBS)}",
                f"-check-keys-batch-size={SCAN_COUNT}",
                f"-web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("prometheus-redis-exporter did not start")

    def scrape(self) -> bytes:
        url = f"http://127.0.0.1:{self.port}/metrics"
        with urllib.request.urlopen(url, timeout=900) as reply:
            body: bytes = reply.read()
        return body

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


class CostClock:
    """Wall time, and CPU time of this process plus the redis-server's (INFO cpu); apart, the
    CPU of the delaying proxy in between, if any."""

    def __init__(self, client: redis.Redis, proxy_pid: int | None = None) -> None:
        self.client = client
        self.proxy_pid = proxy_pid
        self.wall: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}
        self.proxy_cpu: dict[str, list[float]] = {}

    def _server_cpu(self) -> float:
        info = self.client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def time(self, name: str, action: Callable[[], Any]) -> Any:
        proxy = process_cpu(self.proxy_pid) if self.proxy_pid else 0.0
        cpu, server, wall = time.process_time(), self._server_cpu(), time.perf_counter()
        result = action()
        self.wall.setdefault(name, []).append(time.perf_counter() - wall)
        cpu_used = time.process_time() - cpu + self._server_cpu() - server
        self.cpu.setdefault(name, []).append(cpu_used)
        if self.proxy_pid:
            proxy_used = process_cpu(self.proxy_pid) - proxy
            self.proxy_cpu.setdefault(name, []).append(proxy_used)
        return result

    def figures(self, kind: str, name: str) -> list[float]:
        """Every timing of `name` by `kind`: wall, cpu or proxy (CPU)."""
        return {"wall": self.wall, "cpu": self.cpu, "proxy": self.proxy_cpu}[kind][name]

    def median(self, kind: str, name: str) -> float:
        return statistics.median(self.figures(kind, name))


def preset_sampler(url: str, preset: str) -> RedisKeySampler:
    """The key sampler of one preset in its default configuration, every key read."""
    config = config_module.from_dict(
        {"presets": [preset], "sources": {"redis": {"url": url, "max_keys": EVERY_KEY}}}
    )
    assert config.sources.redis is not None and not isinstance(config.sources.redis, list)
    return RedisKeySampler(config.sources.redis, 15.0)


def measure(
    url: str, client: redis.Redis, size: int, args: argparse.Namespace, proxy_pid: int | None = None
) -> dict[str, float]:
    """The figures of the floor, the exporter and the peer reading the keys through `url` (the
    server's own, or a delaying proxy's); `client` reaches the server directly."""
    telemetry = Telemetry(HealthBoard())
    sampler = preset_sampler(url, "orchestrata")
    raw = RawRedis(url)
    gc.freeze()  # as `serve` does once start-up is done (exporter/runtime/app.py)
    binary = shutil.which("prometheus-redis-exporter")
    peer_up_to = args.peer_up_to if proxy_pid is None else args.delayed_peer_up_to
    peer = Peer(binary, url) if binary and size <= peer_up_to else None

    def scraped_cycle() -> None:  # what a scrape of the peer does: read the keys, render
        apply_report(telemetry, None, sampler.name, sampler.sample())
        telemetry.render(False)

    found_at = time.time()
    found = floor_loop(raw)  # the warm-up of each, and the check that they agree
    if len(found) != size or floor_loop(raw, overlap=False).keys() != found.keys():
        raise RuntimeError(f"the floor found {len(found)} keys of {size}")
    same_result(found, sampler.sample().samples, time.time() - found_at + 1)
    if peer is not None:
        body = peer.scrape()
        if body.count(b'redis_key_size{db="db0",key="orchestrata:queue:') != size:
            raise RuntimeError("the peer did not report every queue key")
    clock = CostClock(client, proxy_pid)
    for _ in range(args.runs if proxy_pid is None else args.delayed_runs):
        clock.time("floor", lambda: floor_loop(raw))
        clock.time("floor, SCAN alone", lambda: floor_loop(raw, overlap=False))
        cycle = clock.time("exporter", sampler.sample)
        same_result(found, cycle.samples, time.time() - found_at + 1)
        if peer is not None:
            clock.time("scraped", scraped_cycle)
            clock.time("peer", peer.scrape)
    kinds = ("wall", "cpu") if proxy_pid is None else ("wall", "cpu", "proxy")
    figures = {f"{kind} {name}": clock.median(kind, name) for kind in kinds for name in clock.wall}
    figures["round trip"] = raw.round_trip_time()
    raw.close()
    sampler.close()
    if peer is not None:
        peer.close()
    return figures


def load_average() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def plot(results: dict[int, dict[str, float]], path: str, load: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=110)
    lines = (
        ("wall peer", "prometheus-redis-exporter --check-keys (scrape)", "tab:red"),
        ("wall exporter", "queue-exporter cycle (default configuration)", "tab:blue"),
        ("wall floor", "floor: raw hiredis, same reads and parsing", "tab:gray"),
    )
    for name, label, colour in lines:
        sizes = [size for size, figures in results.items() if name in figures]
        axes.plot(sizes, [results[s][name] for s in sizes], "o-", label=label, color=colour)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("queue keys (among 100,000 other keys)")
    axes.set_ylabel("seconds per cycle (median wall time)")
    axes.set_title(f"Redis key sampling, orchestrata preset (load average {load})")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)


def print_row(size: int, path: str, figures: dict[str, float]) -> None:
    floor, ours = figures["wall floor"], figures["wall exporter"]
    floor_cpu, ours_cpu = figures["cpu floor"], figures["cpu exporter"]
    peer_text = f"{'-':>8} {'-':>8} {'-':>7}"
    if "wall peer" in figures:
        peer, scraped = figures["wall peer"], figures["wall scraped"]
        peer_text = f"{peer:8.2f} {scraped:8.3f} {peer / scraped:6.1f}x"
    print(
        f"{size:>10} {path:>9} {floor:8.3f} {ours:10.3f} {ours / floor:5.2f}x "
        f"{floor_cpu:11.3f} {ours_cpu:14.3f} {ours_cpu / floor_cpu:5.2f}x {peer_text}",
        flush=True,
    )
    alone, alone_cpu = figures["wall floor, SCAN alone"], figures["cpu floor, SCAN alone"]
    details = [
        f"PING round trip {figures['round trip'] * 1000:.3f} ms",
        f"the floor with each SCAN in a round trip of its own: {alone:.3f} s "
        f"({alone / floor:.2f}x), CPU {alone_cpu:.3f} s ({alone_cpu / floor_cpu:.2f}x)",
    ]
    proxy = {
        name: figures[f"proxy {name}"]
        for name in ("floor", "exporter", "peer", "scraped")
        if f"proxy {name}" in figures
    }
    if proxy:
        spent = ", ".join(f"{name} {cpu:.3f} s" for name, cpu in proxy.items())
        details.append(f"the proxy's own CPU (counted on no side): {spent}")
    for detail in details:
        print(f"{'':>20} {detail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--unrelated", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--peer-up-to", type=int, default=100_000)
    parser.add_argument("--plot", help="write a PNG of the loopback wall times against the keys")
    parser.add_argument(
        "--one-way-ms",
        default="",
        help="also through a proxy delaying each way this much: 0.1,0.25",
    )
    parser.add_argument("--delayed-runs", type=int, default=3, help="runs through each proxy")
    parser.add_argument(
        "--delayed-peer-up-to",
        type=int,
        default=10_000,
        help="the peer through a proxy only up to this many keys (a round trip per command per key)",
    )
    args = parser.parse_args()
    if not shutil.which("prometheus-redis-exporter"):
        print("prometheus-redis-exporter absent: the Go peer is not measured")
    delays = [float(ms) for ms in args.one_way_ms.split(",") if ms]

    results: dict[int, dict[str, float]] = {}
    loads = [load_average()]
    print(
        f"{'queue keys':>10} {'one-way':>9} {'floor s':>8} {'exporter s':>10} {'ratio':>6} "
        f"{'floor cpu s':>11} {'exporter cpu s':>14} {'ratio':>6} "
        f"{'peer s':>8} {'scrape s':>8} {'faster':>7}"
    )
    with private_redis() as url:
        client = redis.Redis.from_url(url)
        for size in (int(s) for s in args.sizes.split(",")):
            load_keys(client, size, args.unrelated)
            results[size] = measure(url, client, size, args)
            print_row(size, "loopback", results[size])
            for one_way in delays:
                with delayed(url, one_way / 1000) as (proxy_url, proxy_pid):
                    figures = measure(proxy_url, client, size, args, proxy_pid)
                print_row(size, f"{one_way:g} ms", figures)
            loads.append(load_average())
        client.close()
    print(f"load average (1 min) at the start and after each size: {', '.join(loads)}")
    if args.plot:
        plot(results, args.plot, f"{min(loads, key=float)}-{max(loads, key=float)}")


if __name__ == "__main__":
    main()
