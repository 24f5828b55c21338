"""What a SCAN pass costs Redis: a key visited, a key returned, and one shared pass against one
per key group (exporter/sources/redis_keys/scans.py).

    .venv/bin/python bench/scan_cost.py [--redis-server PATH ...] [--runs 7]
        [--queues 10000] [--unrelated 100000]

For each redis-server binary (the one on PATH by default; give --redis-server once per
binary to compare versions, e.g. builds of 7.2 and 7.4), a server of the benchmark's own holds
`--queues` Orchestrata queue lists and `--unrelated` other keys. Each full SCAN loop (COUNT
1000, a raw socket, hiredis) runs in turn for every MATCH below, servers round robin, `--runs`
times after a warm-up; Redis's own time for the loop is read from INFO commandstats (the usec
of its SCAN calls), medians printed:
- the preset's two globs apart (what the exporter did before sources/redis_keys/scans.py), their sum;
- their shared glob, orchestrata:* (what it does now): the ratio of the two is what sharing
  saves Redis;
- a glob that matches nothing (each key visited, none returned) and `*` (each key returned):
  the cost of a visited key, and what returning one adds.
The two ways of scanning are checked to find the same queue keys.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import hiredis
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.key_sampling import PRESET_GLOBS as APART
from bench.key_sampling import PRESET_KEYS
from bench.key_sampling import SHARED_GLOB as SHARED
from tests.private_redis import PrivateRedis

NOTHING = "nothing-matches:*"
EVERYTHING = "*"


@contextmanager
def server(binary: str) -> Iterator[redis.Redis]:
    """A redis-server of the benchmark's own from `binary` (a free port, a temp dir)."""
    with tempfile.TemporaryDirectory() as directory:
        private = PrivateRedis(Path(directory), binary=binary).start()
        client = private.client()
        try:
            yield client
        finally:
            client.close()
            private.stop()


def load(client: redis.Redis, queues: int, unrelated: int) -> None:
    item = json.dumps({"queued_at": "2026-11-29T18:00:00+00:00", "message_id": "m"})
    pipe = client.pipeline(transaction=False)
    for index in range(queues):
        pipe.rpush(f"orchestrata:queue:recipient-{index}:p{index % 6}", item)
    for index in range(unrelated):
        pipe.set(f"session:{index}", "x")
    pipe.execute()


def scan_loop(sock: socket.socket, glob: str) -> list[bytes]:
    """Every key SCAN MATCH `glob` returns, in the leanest loop."""
    reader, cursor, found = hiredis.Reader(), b"0", []
    while True:
        sock.sendall(hiredis.pack_command(("SCAN", cursor, "MATCH", glob, "COUNT", 1000)))
        reply: Any = False
        while reply is False:
            reader.feed(sock.recv(1 << 20))
            reply = reader.gets()
        cursor, keys = reply
        found += keys
        if cursor == b"0":
            return found


def redis_time(client: redis.Redis, sock: socket.socket, glob: str) -> tuple[float, list[bytes]]:
    """Redis's own time (s) for a full SCAN loop of `glob`, and the keys it returned."""
    client.config_resetstat()
    keys = scan_loop(sock, glob)
    return client.info("commandstats")["cmdstat_scan"]["usec"] / 1e6, keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-server", action="append", help="a redis-server binary")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--unrelated", type=int, default=100_000)
    args = parser.parse_args()
    binaries = args.redis_server or [shutil.which("redis-server") or "redis-server"]
    globs = (*APART, SHARED, NOTHING, EVERYTHING)
    with ExitStack() as stack:
        servers = {}
        for binary in binaries:
            client = stack.enter_context(server(binary))
            load(client, args.queues, args.unrelated)
            port = client.connection_pool.connection_kwargs["port"]
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", port)))
            servers[client.info("server")["redis_version"]] = (client, sock)
        times: dict[tuple[str, str], list[float]] = {}
        for run in range(args.runs + 1):  # the first is the warm-up
            for glob in globs:
                for version, (client, sock) in servers.items():
                    spent, keys = redis_time(client, sock, glob)
                    if run:
                        times.setdefault((version, glob), []).append(spent)
                    if glob == SHARED and not run:  # checked once
                        shared = {key for key in keys if PRESET_KEYS.match(key)}
                        apart = {key for one in APART for key in scan_loop(sock, one)}
                        if shared != apart or len(shared) != args.queues:
                            raise RuntimeError(f"{version}: shared and apart SCANs differ")
    keys = args.queues + args.unrelated
    print(f"{keys} keys, {args.queues} of them queues; Redis's time per full SCAN loop (ms)")
    print(
        f"{'redis':>8} {'apart':>8} {'shared':>8} {'saved':>6} {'visited µs/key':>15} "
        f"{'returned µs/key more':>21}"
    )
    for version in servers:
        median = {glob: statistics.median(times[version, glob]) for glob in globs}
        apart = sum(median[glob] for glob in APART)
        visited = median[NOTHING] / keys
        returned = (median[EVERYTHING] - median[NOTHING]) / keys
        print(
            f"{version:>8} {apart * 1000:8.1f} {median[SHARED] * 1000:8.1f} "
            f"{apart / median[SHARED]:5.2f}x {visited * 1e6:15.3f} {returned * 1e6:21.3f}"
        )


if __name__ == "__main__":
    main()
