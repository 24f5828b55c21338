"""Peak RSS of `serve` with one system's preset against a private redis-server holding
--queues queues of it, each with one job (issue 40: 100,000 queues against the chart's 256Mi;
Dramatiq: --queues workers' heartbeats, each naming an acks set per queue).

    .venv/bin/python bench/discovered_queues.py [--queues 100000] [--systems rq,bullmq,...]
        [--seconds 30]

Each system's queues are written as the system writes them (keys and the sets that name
them; one pending job each); `serve` runs with the system's preset (its native reader on, as
shipped) for --seconds, scraped every 2 s; its peak RSS (VmHWM) is printed, with the
queue_depth series served and the native reader's refusals (over_limit).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.private_redis import PrivateRedis, free_port


def _seed(client, system: str, queues: int) -> None:
    pipe = client.pipeline(transaction=False)
    for n in range(queues):
        q = f"q{n}"
        if system == "rq":
            pipe.sadd("rq:queues", f"rq:queue:{q}")
            pipe.rpush(f"rq:queue:{q}", f"job-{n}")
            pipe.hset(f"rq:job:job-{n}", mapping={"enqueued_at": "2026-01-01T00:00:00.000000Z"})
        elif system == "bullmq":
            pipe.hset(f"bull:{q}:meta", mapping={"opts.maxLenEvents": "10000"})
            pipe.lpush(f"bull:{q}:wait", "1")
            pipe.hset(f"bull:{q}:1", mapping={"name": "x", "timestamp": "1767225600000"})
        elif system == "celery":
            pipe.sadd("_kombu.binding.celery", f"{q}\x06\x16\x06\x16{q}")
            pipe.rpush(q, json.dumps({"headers": {"task": "t"}, "properties": {}}))
        elif system == "sidekiq":
            pipe.sadd("queues", q)
            pipe.rpush(f"queue:{q}", json.dumps({"class": "W", "enqueued_at": 1767225600.0}))
        elif system == "dramatiq":  # --queues workers' heartbeats, one queue: an acks set each
            pipe.zadd("dramatiq:__heartbeats__", {f"worker-{n}": time.time() * 1000})
            pipe.hset("dramatiq:default.msgs", f"m{n}", json.dumps({"message_timestamp": 1}))
        if n % 10_000 == 9_999:
            pipe.execute()
    pipe.execute()


def _rss_peak(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("VmHWM")


def run(
    system: str, queues: int, seconds: float, params: dict[str, object], max_keys: int | None
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as directory:
        server = PrivateRedis(Path(directory)).start()
        try:
            _seed(server.client(), system, queues)
            port = free_port()
            config = Path(directory) / "config.json"
            preset = {"name": system, "params": params}
            redis: dict[str, object] = {"url": server.url}
            if max_keys is not None:
                redis["max_keys"] = max_keys
            config.write_text(json.dumps({"presets": [preset], "sources": {"redis": redis}}))
            command = [sys.executable, "-m", "exporter", "serve", "--config", str(config),
                       "--listen-address", f"127.0.0.1:{port}"]  # fmt: skip
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                body, ends = "", time.monotonic() + seconds
                while time.monotonic() < ends:
                    time.sleep(2)
                    try:
                        url = f"http://127.0.0.1:{port}/metrics"
                        body = urllib.request.urlopen(url, timeout=30).read().decode()
                    except OSError:
                        continue
                peak = _rss_peak(process.pid)
            finally:
                process.terminate()
                process.wait(30)
        finally:
            server.stop()
    depth = sum(1 for line in body.splitlines() if line.startswith("queue_depth{"))
    over = sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("queue_exporter_events_invalid_total{") and "over_limit" in line
    )
    return {"peak_rss_mib": peak, "queue_depth_series": depth, "over_limit": over}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=100_000)
    parser.add_argument("--systems", default="rq,bullmq,celery,sidekiq")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--params", default="{}", help="the presets' params, as JSON")
    parser.add_argument("--max-keys", type=int, help="the Redis source's max_keys (lifted: 10**7)")
    args = parser.parse_args()
    for system in args.systems.split(","):
        figures = run(system, args.queues, args.seconds, json.loads(args.params), args.max_keys)
        shown = ", ".join(f"{key} {value:.4g}" for key, value in figures.items())
        print(f"{system:8} {args.queues} queues: {shown}", flush=True)


if __name__ == "__main__":
    main()
