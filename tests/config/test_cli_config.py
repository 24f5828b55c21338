"""The command line and configuration: errors with their paths, masking, precedence, serve."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from exporter.commands import cli
from exporter.config import settings as config_module
from tests.conftest import value
from tests.timing import process_cost

EXPORTER = [sys.executable, "-m", "exporter"]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EXPORTER, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.fast
def test_version():
    result = run_cli("--version")
    assert result.returncode == 0
    assert "queue-exporter" in result.stdout


@pytest.mark.fast
def test_the_gc_is_back_on_for_every_command_but_serve_which_turns_it_on_listening():
    """exporter/__main__.py turns the cyclic GC off while the command line loads."""
    script = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('gc on' if gc.isenabled() else 'gc off'))\n"
        "sys.argv = ['queue-exporter', 'presets']\n"
        "from exporter.__main__ import main\n"
        "main()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "orchestrata" in result.stdout and result.stdout.splitlines()[-1] == "gc on"


BAD_CONFIG = """
sample_interval: 0
listen_address: nowhere
sources:
  redis:
    key_groups:
      - {system: a, pattern: "jobs:{queue}", type: list, state: pending}
      - {system: a, pattern: "jobs:{queue}", type: list, state: waiting}
      - {system: a, pattern: "jobs:{tenant}", type: list, state: pending}
      - {system: a, pattern: "jobs:{queue}", type: list, state: pending, due: {metric: queue_scheduled_due}}
surprise: true
"""


@pytest.mark.fast
def test_check_config_reports_every_error_with_its_path(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(BAD_CONFIG)
    result = run_cli("check-config", str(path))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    for expected in (
        "sample_interval: Input should be greater than 0",
        "listen_address: Value error, expected HOST:PORT, got 'nowhere'",
        "sources.redis.key_groups[1].state: Input should be",
        "sources.redis.key_groups[2]: Value error, pattern placeholder {tenant} is not a label",
        "sources.redis.key_groups[3]: Value error, due applies to zset keys only, not list",
        "surprise: Extra inputs are not permitted",
    ):
        assert expected in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sources: [1, 2", "not valid YAML"),
        ("- just\n- a list\n", "the top level must be a mapping"),
        ("presets: [nosuch]\n", "unknown preset 'nosuch'"),
        ("presets: [{name: celery, params: {queus: [a]}}]\n", "unknown params queus"),
    ],
)
@pytest.mark.fast
def test_check_config_rejects_malformed_files(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = run_cli("check-config", str(path))
    assert result.returncode == 1
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.fast
def test_check_config_masks_secrets(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(
        "presets: [orchestrata]\n"
        "sources:\n  redis:\n    url: redis://app:s3cr3t-pw@redis.internal:6379/2\n"
        "    password: another-s3cr3t\n"
    )
    result = run_cli("check-config", str(path))
    assert result.returncode == 0, result.stderr
    assert "s3cr3t" not in result.stdout
    assert "redis://app:****@redis.internal:6379/2" in result.stdout
    assert "orchestrata:queue:{queue}:p{priority}" in result.stdout  # the preset, expanded


@pytest.mark.fast
def test_flags_beat_environment_beats_file(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    path.write_text("sample_interval: 30\nlog_level: warning\nlisten_address: 127.0.0.1:1111\n")
    monkeypatch.setenv("QUEUE_EXPORTER_SAMPLE_INTERVAL", "7")
    monkeypatch.setenv("QUEUE_EXPORTER_LISTEN_ADDRESS", "127.0.0.1:3333")
    loaded = []

    def load_only(config_file, overrides):  # stop before serving: the merge is what is tested
        loaded.append(config_module.load(config_file, overrides))
        raise SystemExit(0)

    monkeypatch.setattr(cli, "_load_or_exit", load_only)
    result = CliRunner().invoke(
        cli.main, ["serve", "--config", str(path), "--listen-address", "127.0.0.1:2222"]
    )
    assert result.exit_code == 0
    assert loaded[0].listen_address == "127.0.0.1:2222"  # flag over environment and file
    assert loaded[0].sample_interval == 7  # environment over file
    assert loaded[0].log_level == "warning"  # file where nothing overrides it


def test_serve_samples_presets_and_stops_on_sigterm(redis_client, redis_url, serve_process):
    redis_client.rpush("orchestrata:queue:billing:p2", '{"queued_at": "2026-01-01T00:00:00Z"}')
    redis_client.zadd("default:processing", {"a:{}": 1000})  # a lease that expired long ago
    exporter = serve_process(
        "--redis-url",
        redis_url,
        "--preset",
        "orchestrata",
        "--preset",
        "runnerq",
        "--sample-interval",
        "1",
        "--log-format",
        "json",
    )
    series = exporter.series_when(lambda s: value(s, "queue_depth", queue="billing"))
    assert value(series, "queue_depth", system="orchestrata", queue="billing") == 1
    assert value(series, "queue_max_depth", system="orchestrata", queue="billing") == 10000
    assert value(series, "queue_leases_expired", system="runnerq", queue="default") == 1
    assert value(series, "queue_exporter_source_up", source="redis") == 1
    load = process_cost()  # what this machine's load adds to a process's stop, now
    started = time.monotonic()
    exporter.process.send_signal(signal.SIGTERM)
    assert exporter.process.wait(timeout=120) == 0
    assert time.monotonic() - started < 5 + load  # docs/operations.md "Shutdown"
    _, stderr = exporter.process.communicate()
    assert '"msg": "received SIGTERM, shutting down"' in stderr


def _resolved(tmp_path, args, env=None, file_text=None):
    """What check-config prints for a configuration given by flags, environment or file."""
    extra = []
    if file_text is not None:
        path = tmp_path / "config.yaml"
        path.write_text(file_text)
        extra = [str(path)]
    environment = {key: val for key, val in os.environ.items() if not key.startswith("QUEUE_EX")}
    result = subprocess.run(
        [*EXPORTER, "check-config", *extra, *args, "--show-config"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**environment, **(env or {})},
    )
    return result


def test_preset_params_from_flags_and_environment_as_from_the_file(tmp_path):
    """--preset 'NAME:PARAM=VALUE;PARAM=VALUE' and QUEUE_EXPORTER_PRESET resolve to the same
    configuration as the file's {name, params}."""
    file_text = (
        "presets:\n  - {name: celery, params: {queues: [a, b], native: false, sep: ':'}}\n  - rq\n"
    )
    by_file = _resolved(tmp_path, [], file_text=file_text)
    spec = 'celery:queues=a,b;native=false;sep=":"'
    by_flag = _resolved(tmp_path, ["--preset", spec, "--preset", "rq"])
    by_env = _resolved(tmp_path, [], env={"QUEUE_EXPORTER_PRESET": f"{spec} rq"})
    for result in (by_file, by_flag, by_env):
        assert result.returncode == 0, result.stderr
    assert by_file.stdout == by_flag.stdout == by_env.stdout
    assert "pattern: '{queue}:{_step}'" in by_file.stdout  # sep=":" reached the key groups
    assert "    celery:\n      enabled: false\n" in by_file.stdout  # native=false too


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("celery:queus=a", "unknown params queus (did you mean 'queues'?"),
        ("celry:queues=a", "unknown preset 'celry' (did you mean 'celery'?"),
        ("celery:native=maybe", "param native: expected true or false, got 'maybe'"),
        ("orchestrata:max_depth=many", "param max_depth: expected a number (int), got 'many'"),
        ("celery:queues", "'queues' is not PARAM=VALUE"),
    ],
)
def test_preset_params_from_flags_and_environment_are_checked_as_the_file(tmp_path, spec, expected):
    for result in (
        _resolved(tmp_path, ["--preset", spec]),
        _resolved(tmp_path, [], env={"QUEUE_EXPORTER_PRESET": spec}),
    ):
        assert result.returncode == 1
        assert expected in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    name, _, assignment = spec.partition(":")
    param, _, value = assignment.partition("=")
    if name == "celery" and param == "queus":  # the file's error says the same
        by_file = _resolved(
            tmp_path, [], file_text=f"presets: [{{name: {name}, params: {{{param}: [{value}]}}}}]\n"
        )
        assert by_file.returncode == 1 and expected in by_file.stderr, by_file.stderr


DEEP = "[" * 1000 + "]" * 1000  # 2 KB: a value nested 1,000 deep (issue 40)


def _command(command, tmp_path, args, env=None, file_text=None):
    """`command` (serve or check-config) with no QUEUE_EXPORTER_* variable but `env`'s."""
    extra = []
    if file_text is not None:
        path = tmp_path / "config.yaml"
        path.write_text(file_text)
        extra = ["--config", str(path)]
    environment = {key: val for key, val in os.environ.items() if not key.startswith("QUEUE_EX")}
    return subprocess.run(
        [*EXPORTER, command, *extra, *args, "--listen-address", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**environment, **(env or {})},
    )


@pytest.mark.parametrize("command", ["check-config", "serve"])
def test_params_nested_any_depth_are_a_config_error_naming_the_place(tmp_path, command):
    """Before, params nested 1,000 deep ended both commands in a 1,000-frame RecursionError."""
    spec = f"celery:queues={DEEP}"
    # the 33rd level of the value: its 33rd bracket, the 32 before it on line 1
    for result in (
        _command(command, tmp_path, ["--preset", spec]),
        _command(command, tmp_path, [], env={"QUEUE_EXPORTER_PRESET": spec}),
    ):
        assert result.returncode == 1
        assert "(presets[0]): preset celery: param queues: line 1 column 33: nested deeper" in (
            result.stderr
        ), result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr) < 500
    # In the file, the 33rd level counts its mapping, presets, the entry and params: the
    # 29th bracket, after the 14 characters of "      queues: " and 28 brackets.
    by_file = _command(
        command,
        tmp_path,
        [],
        file_text=f"presets:\n  - name: celery\n    params:\n      queues: {DEEP}\n",
    )
    assert by_file.returncode == 1
    assert f"{tmp_path / 'config.yaml'}: line 4 column 43: nested deeper" in by_file.stderr
    assert "Traceback" not in by_file.stderr


@pytest.mark.parametrize("command", ["check-config", "serve"])
@pytest.mark.fast
def test_a_value_that_contains_itself_is_a_config_error_naming_the_place(tmp_path, command):
    """A YAML alias inside its own anchor makes a value of infinite depth."""
    file_text = "presets:\n  - name: celery\n    params: &params\n      queues: [*params]\n"
    result = _command(command, tmp_path, [], file_text=file_text)
    assert result.returncode == 1
    assert "  presets[0].params.queues[0].queues[0].queues" in result.stderr, result.stderr
    assert "nested deeper than" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("command", ["check-config", "serve"])
def test_a_mistyped_variable_is_refused_as_an_unknown_key_of_the_file_is(tmp_path, command):
    """Before, QUEUE_EXPORTER_REDIS_ULR was only warned about, and serve went on sampling the
    default redis://127.0.0.1:6379/0."""
    env = {"QUEUE_EXPORTER_REDIS_ULR": "redis://10.0.0.9:6379/0", "QUEUE_EXPORTER_TYPO": "1"}
    by_env = _command(command, tmp_path, ["--preset", "orchestrata"], env=env)
    assert by_env.returncode == 1
    assert by_env.stderr.startswith("error: invalid environment:\n")
    assert (
        "  QUEUE_EXPORTER_REDIS_ULR: not a setting (did you mean QUEUE_EXPORTER_REDIS_URL?)"
        in by_env.stderr
    )
    assert "  QUEUE_EXPORTER_TYPO: not a setting (known: QUEUE_EXPORTER_CONFIG," in by_env.stderr
    by_file = _command(command, tmp_path, [], file_text="presets: [orchestrata]\nredis_ulr: x\n")
    assert by_file.returncode == 1 and "redis_ulr: Extra inputs are not permitted" in (
        by_file.stderr
    )
