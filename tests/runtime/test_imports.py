"""What importing a module loads: reading a configuration loads no client, SDK or server, and
`serve` loads only what its configuration uses (start-up time and memory in every pod)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from exporter.sources.readers import registry

HEAVY = ("opentelemetry", "redis", "hiredis", "psycopg", "psycopg_pool", "tornado")


def loaded_after(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after running `statement`."""
    script = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return set(json.loads(done.stdout.splitlines()[-1]))


def packages(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


@pytest.mark.fast
def test_reading_a_configuration_loads_no_client_sdk_or_server():
    modules = loaded_after(
        "from exporter.config import settings as config\n"
        "config.from_dict({'presets': ['orchestrata', 'rq', 'attune'],"
        " 'sources': {'redis': {'url': 'redis://127.0.0.1:1/0'}}})"
    )
    assert packages(modules) & set(HEAVY) == set()
    assert "exporter.config.settings" in modules  # the import itself did happen


@pytest.mark.fast
def test_validating_a_configuration_looks_for_no_pydantic_plugins():
    """Looking for plugins reads the metadata of every installed distribution (start-up time);
    the exporter uses none, so the look-up never runs: pydantic's cache of plugins stays unset."""
    script = (
        "import os\n"
        "from exporter.config import settings as config\n"
        "config.from_dict({'presets': ['orchestrata'], 'sources': {'redis': {}}})\n"
        "from pydantic.plugin import _loader\n"
        "print(os.environ['PYDANTIC_DISABLE_PLUGINS'], _loader._plugins)"
    )
    environment = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    output = subprocess.run(
        [sys.executable, "-c", script],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    ).stdout
    assert output.split() == ["__all__", "None"]


@pytest.mark.parametrize(
    ("configured", "absent"),
    [
        (
            "{'presets': ['orchestrata'], 'sources': {'redis': {'url': 'redis://127.0.0.1:1/0'}}}",
            [
                "psycopg",
                "psycopg_pool",
                "exporter.demo",
                "exporter.sources.readers.celery",
                "opentelemetry.exporter.otlp",
            ],
        ),
        (
            "{'presets': ['rq'], 'sources': {'redis': {'url': 'redis://127.0.0.1:1/0'}}}",
            [
                "psycopg",
                "exporter.demo",
                "exporter.sources.readers.celery",
                "exporter.sources.readers.bullmq",
                "exporter.sources.readers.sidekiq",
            ],
        ),
    ],
)
def test_serve_loads_only_what_its_configuration_uses(configured: str, absent: list[str]):
    modules = loaded_after(
        "from exporter.commands import cli\nfrom exporter.config import settings as config\n"
        "from exporter.runtime.build import build, build_event_metrics\n"
        "from exporter.output.health import HealthBoard\n"
        "from exporter.output.telemetry import Telemetry\n"
        f"parsed = config.from_dict({configured})\n"
        "telemetry = Telemetry(HealthBoard())\n"
        "build(parsed, telemetry, build_event_metrics(parsed, telemetry))"
    )
    assert "exporter.sources.redis_keys.sampler" in modules  # the sources were built
    assert [name for name in absent if name in modules or name in packages(modules)] == []


@pytest.mark.fast
def test_serve_answers_before_loading_redis_py_the_sources_or_the_sdk():
    """`serve` listens (App with listen_first) before the sources' and the SDK's imports: its
    first answer waits for no redis-py, reader, PostgreSQL driver or OpenTelemetry SDK."""
    modules = loaded_after(
        "import urllib.request\n"
        "from exporter.commands import cli\nfrom exporter.config import settings as config\n"
        "from exporter.runtime.app import App\n"
        "parsed = config.from_dict({'presets': ['orchestrata'], 'listen_address': '127.0.0.1:0',"
        " 'sources': {'redis': {'url': 'redis://127.0.0.1:1/0'}}})\n"
        "app = App(parsed, listen_first=True)\n"
        "app.listen()\n"
        "url = f'http://127.0.0.1:{app.server.port}/metrics'\n"
        "assert b'queue_exporter_build_info' in urllib.request.urlopen(url, timeout=10).read()\n"
        "app.shutdown()"
    )
    assert "exporter.http.server" in modules  # the listener was built
    absent = ["redis", "hiredis", "psycopg", "psycopg_pool", "exporter.demo"]
    absent += [
        "exporter.runtime.build",
        "exporter.sources.readers.framework",
        "exporter.sources.streams.consumer",
    ]
    # nor the self-metrics' OpenTelemetry SDK and prometheus_client; no web config file given:
    # nor its models and bcrypt
    absent += ["opentelemetry", "prometheus_client", "psutil", "exporter.output.self_metrics"]
    absent += ["exporter.http.web_config", "bcrypt"]
    assert [name for name in absent if name in modules or name in packages(modules)] == []


# What a one-preset Redis sidecar (`serve --preset rq`, `--preset celery` with its reader) never
# loads, each a backend or an output its configuration does not use (issue 42: memory and
# start-up in every worker pod). Not on the list, loaded by what the sidecar does use:
# redis.asyncio and redis.observability (redis-py 8.1 imports both from its own __init__ and
# its commands), asyncio (Tornado), prometheus_client (the self-metrics' exposition).
UNUSED_BY_A_REDIS_SIDECAR = [
    "psycopg",
    "psycopg_pool",
    "exporter.sources.postgres.source",
    "opentelemetry.exporter.otlp",
    "google.protobuf",
    "grpc",
    "requests",
    "exporter.demo",
    "exporter.commands.emit",
    "exporter.lifecycle.producer",
    "exporter.sources.streams.consumer",
]
# Each native reader's module (registry.READERS names them), and the finished-rows reader
# (a PostgreSQL source's, not in that registry)
READERS = [*registry.READERS, "finished_rows"]


def loaded_by_serve(configured: str) -> set[str]:
    """The modules of a process holding what `serve` builds for `configured`: the sources, the
    self-metrics and, when enabled, OTLP (built, not started; its last push at shutdown goes to
    port 1, where nothing listens, rather than to whatever may listen on the default port)."""
    return loaded_after(
        "import os\n"
        "os.environ['OTEL_EXPORTER_OTLP_ENDPOINT'] = 'http://127.0.0.1:1'\n"
        "from exporter.commands import cli\nfrom exporter.config import settings as config\n"
        "from exporter.runtime.app import App\n"
        # a port of its own: the default may be held by another test's exporter
        f"app = App(config.from_dict({{**{configured}, 'listen_address': '127.0.0.1:0'}}))\n"
        "app.shutdown()"
    )


def present(names: list[str], modules: set[str]) -> list[str]:
    return [name for name in names if name in modules or name in packages(modules)]


@pytest.mark.parametrize("preset", ["rq", "celery"])
def test_a_redis_sidecar_loads_no_backend_or_output_it_does_not_use(preset: str):
    modules = loaded_by_serve(
        f"{{'presets': ['{preset}'], 'sources': {{'redis': {{'url': 'redis://127.0.0.1:1/0'}}}}}}"
    )
    assert f"exporter.sources.readers.{preset}" in modules  # its reader was built
    other_readers = [f"exporter.sources.readers.{name}" for name in READERS if name != preset]
    assert present(UNUSED_BY_A_REDIS_SIDECAR + other_readers, modules) == []


@pytest.mark.parametrize(
    ("configured", "needed"),
    [
        (
            "{'presets': ['rq'], 'otlp': {'enabled': True},"
            " 'sources': {'redis': {'url': 'redis://127.0.0.1:1/0'}}}",
            ["opentelemetry.exporter.otlp", "google.protobuf"],
        ),
        (
            "{'presets': ['oban'], 'sources': {'postgres':"
            " {'dsn': 'postgresql://nobody@127.0.0.1:1/none', 'connect_timeout': 1}}}",
            ["psycopg", "psycopg_pool", "exporter.sources.postgres.source"],
        ),
    ],
)
def test_a_backend_or_output_the_configuration_uses_is_loaded(configured: str, needed: list[str]):
    """The other side of the test above: the same look finds what a configuration does use,
    so a name on that list would be seen if it were loaded."""
    assert present(needed, loaded_by_serve(configured)) == needed
