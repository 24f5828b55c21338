"""At rest: the CPU and memory of an idle `queue-exporter serve` (issue 42's sidecar cost).

    .venv/bin/python bench/at_rest.py [--presets rq,celery] [--settle 20] [--seconds 280]
        [--before DIR] [--env NAME=VALUE]

A redis-server of the benchmark's own, empty. For each preset, `serve --preset NAME` starts
at the default interval, is left `--settle` seconds (start-up and the first cycles), and is
then watched for `--seconds`: the CPU it used in that time (user and system, from
/proc/PID/stat, in clock ticks) per second of wall time, and its resident memory (VmRSS, and
of it the anonymous and the file-backed pages) at the end: by default 5 minutes after the
start, issue 42's measure. A scrape before and after proves it serves. `--before DIR` runs
another source tree (a checkout of an earlier commit) the same way, alternating with this
one, so a change is measured against what it changed under the same load; `--env NAME=VALUE`
runs this tree a second time with that variable set (MALLOC_ARENA_MAX=2, say), alternated too.

First, the named stack alone (NAMED_STACK): what any Python sidecar on the OTel SDK and its
Prometheus exporter holds, whatever Redis client, HTTP server and configuration it runs on.
Then the floor: a fresh interpreter that imports only the libraries a Redis sidecar
cannot run without (redis-py, Tornado, pydantic), validates one pydantic model (which loads
pydantic's schema builder, as the configuration does) and sleeps; its RSS is what no change
that keeps these libraries can go below. Then the same with what the exporter adds, layer by layer
(LAYERS): where the rest of its RSS comes from. Last, every library group the sidecar loads
(LIBRARIES), then all but one, for each: what leaving that group would save, given the others
(asyncio, ssl and the OTel SDK are shared by several).

The tick is 10 ms: over 280 s, one tick is 0.04 ms/s, the resolution of the CPU figure.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.key_sampling import private_redis
from tests.private_redis import free_port

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


# Each group of libraries the sidecar loads, as it uses them (pydantic with one model
# validated: that loads its schema builder, as the configuration does).
LIBRARIES = {
    "redis-py": "import redis",
    "Tornado": "import tornado.web, tornado.httpserver",
    "pydantic (one model)": "import pydantic\nclass One(pydantic.BaseModel):\n    x: int\nOne(x=1)",
    "the OTel SDK and prometheus_client": (
        "import prometheus_client, opentelemetry.exporter.prometheus, opentelemetry.sdk.metrics"
    ),
    "yaml, click": "import yaml, click",
}
# What any sidecar on the project's named stack loads, whatever its Redis client, HTTP server
# and configuration: the OTel SDK with its Prometheus exporter, hiredis, and the standard
# library's asyncio, ssl and HTTP server. No rewrite inside the exporter goes below it.
NAMED_STACK = (
    LIBRARIES["the OTel SDK and prometheus_client"] + "\nimport hiredis, asyncio, ssl, http.server"
)
# What the exporter adds to the floor (the libraries under `serve --preset rq` and `--preset
# celery`), layer by layer, each in a fresh interpreter with those before.
LAYERS = {
    "floor: redis-py, Tornado, pydantic (one model)": "\n".join(
        LIBRARIES[name] for name in ("redis-py", "Tornado", "pydantic (one model)")
    ),
    "+ yaml, click (configuration, command line)": LIBRARIES["yaml, click"],
    "+ prometheus_client, the OTel SDK's Prometheus reader (self-metrics)": LIBRARIES[
        "the OTel SDK and prometheus_client"
    ],
    "+ the exporter's modules that serve --preset rq imports": (
        "import exporter.commands.cli, exporter.runtime.app, exporter.runtime.build, "
        "exporter.output.self_metrics, exporter.sources.runner, exporter.leader.election, "
        "exporter.sources.redis_keys.sampler, exporter.sources.readers.rq"
    ),
}


def rss_mib(pid: int) -> str:
    """VmRSS, then its anonymous and file-backed parts, in MiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    rss, anonymous, files = (
        int(fields[name].split()[0]) / 1024 for name in ("VmRSS", "RssAnon", "RssFile")
    )
    return f"{rss:6.1f} MiB RSS ({anonymous:4.1f} anon, {files:4.1f} file)"


def idle_rss(tree: Path, script: str) -> str:
    """The RSS of a fresh interpreter that ran `script` and sleeps."""
    script += "\nimport time\nprint(flush=True)\ntime.sleep(3600)"
    process = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        if process.stdout.readline() != b"\n":
            raise RuntimeError(f"{script!r} failed")
        time.sleep(2.0)
        return rss_mib(process.pid)
    finally:
        process.terminate()
        process.wait(30)


def serves(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.status == 200 and b"queue_exporter_build_info" in response.read()


def at_rest(
    tree: Path,
    extra_env: dict[str, str],
    preset: str,
    redis_url: str,
    settle: float,
    seconds: float,
) -> str:
    port = free_port()
    command = [sys.executable, "-m", "exporter", "serve", "--preset", preset]
    command += ["--redis-url", redis_url, "--listen-address", f"127.0.0.1:{port}"]
    environment = {**os.environ, "PYTHONPATH": str(tree), **extra_env}
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            command, cwd=tree, env=environment, stdout=subprocess.DEVNULL, stderr=log
        )
        try:
            time.sleep(settle)
            if process.poll() is not None or not serves(port):
                log.seek(0)
                raise RuntimeError(
                    f"serve --preset {preset} does not serve: {log.read()[-2000:]!r}"
                )
            cpu, started = cpu_seconds(process.pid), time.monotonic()
            time.sleep(seconds)
            used = cpu_seconds(process.pid) - cpu
            wall = time.monotonic() - started
            memory = rss_mib(process.pid)
            if not serves(port):
                raise RuntimeError(f"serve --preset {preset} stopped serving")
        finally:
            process.terminate()
            process.wait(30)
    return f"{1000 * used / wall:5.2f} ms CPU/s  {memory}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", default="rq,celery")
    parser.add_argument("--settle", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=280.0)
    parser.add_argument("--before", type=Path, help="another source tree, run in turn")
    parser.add_argument("--env", help="NAME=VALUE: this tree again with it set, in turn")
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent
    runs: dict[str, tuple[Path, dict[str, str]]] = {"this tree": (here, {})}
    if args.before:
        runs = {"before": (args.before.resolve(), {}), **runs}
    if args.env:
        name, _, value = args.env.partition("=")
        runs[args.env] = (here, {name: value})
    print(f"{idle_rss(here, NAMED_STACK)}  the named stack alone", flush=True)
    script = ""
    for label, layer in LAYERS.items():
        script += layer + "\n"
        print(f"{idle_rss(here, script)}  {label}", flush=True)
    everything = "\n".join(LIBRARIES.values())
    print(f"{idle_rss(here, everything)}  all the libraries", flush=True)
    for left_out in LIBRARIES:
        script = "\n".join(code for name, code in LIBRARIES.items() if name != left_out)
        print(f"{idle_rss(here, script)}  all but {left_out}", flush=True)
    with private_redis() as url:
        for preset in args.presets.split(","):
            for label, (tree, extra_env) in runs.items():
                figure = at_rest(tree, extra_env, preset, url, args.settle, args.seconds)
                print(f"{preset:10s} {label:20s} {figure}", flush=True)


if __name__ == "__main__":
    main()
