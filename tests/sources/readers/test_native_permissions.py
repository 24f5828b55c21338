"""A missing permission costs only the figure that needs it, and `check-config --connect` names
it: a private redis-server whose ACL user has exactly the rules `queue-exporter redis-acl`
prints for the bullmq (saq) preset, less one, and a real BullMQ (SAQ) worker (issue 40: without
`+client|list` the reader counted 0 of 10 completions, failed every read, `/readyz` 503; SAQ's
reader without `+pttl` failed every read the same way).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from exporter.commands import redis_acl
from exporter.config import settings as config_module
from tests.commands.test_check_config import run_cli
from tests.conftest import scrape_series, stop_process, value, wait_for
from tests.private_redis import PrivateRedis
from tests.real_queues import BullMQ
from tests.saq_app.control import driver as saq_driver
from tests.saq_app.control import worker as saq_worker

PASSWORD = "figure-pw"
STREAM = "native:bullmq"


@pytest.fixture
def acl_redis(tmp_path):
    server = PrivateRedis(tmp_path).start()
    yield server
    server.stop()


def _config(server: PrivateRedis, preset: Any = "bullmq") -> dict[str, Any]:
    url = f"redis://queue-exporter:{PASSWORD}@127.0.0.1:{server.port}/0"
    return {"presets": [preset], "sources": {"redis": {"url": url}}, "sample_interval": 0.5}


def _user_without(server: PrivateRedis, raw: dict[str, Any], refused: str) -> None:
    """The ACL user `redis-acl` prints for `raw`, without the rule `refused`."""
    rules = redis_acl.acl_rules(config_module.from_dict(json.loads(json.dumps(raw))))
    assert refused in rules
    rules = [rule for rule in rules if rule != refused]
    admin = server.client()
    admin.execute_command("ACL", "SETUSER", "queue-exporter", "reset", "on", f">{PASSWORD}", *rules)


def test_without_client_list_only_the_worker_count_is_lost(acl_redis, run_exporter):
    raw = _config(acl_redis)
    _user_without(acl_redis, raw, "+client|list")
    bullmq = BullMQ(6, 0, port=acl_redis.port)
    try:
        bullmq.steps({"op": "add", "queue": "mail"})  # the queue exists before the baseline
        app = run_exporter(raw)
        wait_for(lambda: app.health.snapshot()[STREAM].up, timeout=30)
        bullmq.steps(
            {"op": "add", "queue": "mail", "count": 10},
            {"op": "work", "queue": "mail", "completed": 11},
        )
        truth = bullmq.truth(["mail"])["queues"]["mail"]["counts"]["completed"]
        assert truth == 11

        def counted() -> dict | None:
            series = scrape_series(app)
            done = value(series, "queue_jobs_completed_total", system="bullmq", queue="mail")
            return series if done == truth else None

        series = wait_for(counted, timeout=30)
        assert value(series, "queue_exporter_source_up", source=STREAM) == 1
        assert value(series, "queue_exporter_native_silent", stream=STREAM) == 1
        assert not [name for name, _ in series if name == "queue_workers"]  # none invented
        assert app.health.ready()
        assert "+client|list" in (app.health.snapshot()[STREAM].silent or "")
    finally:
        bullmq.stop_all()


def _check(server: PrivateRedis, tmp_path: Path) -> tuple[int, list[str]]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_config(server)))
    result = run_cli("check-config", str(path), "--connect")
    said = [line for line in result.stdout.splitlines() if "native bullmq at" in line]
    return result.returncode, said


def test_check_config_names_each_refused_command_and_what_the_acl_needs(acl_redis, tmp_path):
    _user_without(acl_redis, _config(acl_redis), "+client|list")
    code, said = _check(acl_redis, tmp_path)
    refused = [line for line in said if "refused" in line]
    assert len(refused) == 1, said
    assert "CLIENT LIST refused" in refused[0] and "the ACL needs +client|list" in refused[0]
    assert "queue_workers is not served" in refused[0]
    assert code == 0  # one figure lost: a warning

    _user_without(acl_redis, _config(acl_redis), "+xread")
    code, said = _check(acl_redis, tmp_path)
    refused = [line for line in said if "refused" in line]
    assert len(refused) == 1 and "the ACL needs +xread" in refused[0], said
    assert "every read fails" in refused[0]
    assert code != 0

    _user_without(acl_redis, _config(acl_redis), "%R~bull:*")
    code, said = _check(acl_redis, tmp_path)
    assert any("the ACL needs %R~bull:*" in line for line in said), said
    assert code != 0


def test_check_config_says_nothing_refused_under_the_full_acl(acl_redis, tmp_path):
    raw = _config(acl_redis)
    rules = redis_acl.acl_rules(config_module.from_dict(json.loads(json.dumps(raw))))
    admin = acl_redis.client()
    admin.execute_command("ACL", "SETUSER", "queue-exporter", "reset", "on", f">{PASSWORD}", *rules)
    admin.execute_command("ACL", "LOG", "RESET")
    code, said = _check(acl_redis, tmp_path)
    assert code == 0 and not [line for line in said if "refused" in line], said
    # no trial was refused (check-config's DBSIZE, for the key groups, is no reader's)
    refused = {entry[b"object"] for entry in admin.execute_command("ACL", "LOG")}
    assert refused <= {b"dbsize"}


SAQ_PRESET = {"name": "saq", "params": {"queues": ["work"]}}
SAQ_STREAM = "native:saq"


@pytest.mark.parametrize(
    ("rule", "command"),
    [("+pttl", "PTTL"), ("+psubscribe", "PSUBSCRIBE"), ("&saq:job:*", "PSUBSCRIBE")],
)
def test_saq_without_a_runtime_rule_only_the_runtimes_are_lost(
    acl_redis, run_exporter, tmp_path, rule, command
):
    """SAQ's reader under the ACL redis-acl prints, less one rule only the runtimes need (PTTL
    of the records; PSUBSCRIBE to SAQ's announcements, or their channels): a real worker's 11
    completions counted as SAQ's own worker stats say, its live worker served, the reader up
    and ready; no runtime nor failed count served (none made up), and the status page says
    what the ACL needs. check-config --connect says so too, as a warning."""
    raw = _config(acl_redis, SAQ_PRESET)
    _user_without(acl_redis, raw, rule)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    result = run_cli("check-config", str(path), "--connect")
    lines = result.stdout.splitlines()
    refused = [
        line for line in lines if line.startswith("WARNING") and f"{command} refused" in line
    ]
    assert len(refused) == 1 and f"the ACL needs {rule}" in refused[0], result.stdout
    assert "queue_job_execution_seconds" in refused[0] and result.returncode == 0
    admin_url = acl_redis.url
    worker, _ = saq_worker(admin_url, "work")
    try:
        app = run_exporter(raw)
        wait_for(lambda: app.health.snapshot()[SAQ_STREAM].up, timeout=30)
        saq_driver(
            admin_url, "enqueue", json.dumps([{"queue": "work", "function": "succeed"}] * 11)
        )

        def completed() -> float:
            workers = saq_driver(admin_url, "truth", "work")["queues"]["work"]["workers"]
            return float(sum(stats["complete"] for stats in workers.values()))

        wait_for(lambda: completed() == 11, timeout=60, interval=0.3)

        def counted() -> dict | None:
            series = scrape_series(app)
            done = value(series, "queue_jobs_completed_total", system="saq", queue="work")
            return series if done == 11 else None

        series = wait_for(counted, timeout=30)
        assert value(series, "queue_exporter_source_up", source=SAQ_STREAM) == 1
        assert value(series, "queue_exporter_native_silent", stream=SAQ_STREAM) == 1
        assert value(series, "queue_workers", system="saq", queue="work", state="idle") == 1
        runtimes = [name for name, _ in series if name.startswith("queue_job_execution_seconds")]
        assert not runtimes  # none invented
        assert value(series, "queue_depth", system="saq", queue="work", state="failed") is None
        assert app.health.ready()
        assert rule in (app.health.snapshot()[SAQ_STREAM].silent or "")
    finally:
        stop_process(worker, signal.SIGTERM)


def test_saq_runtimes_refused_meanwhile_are_observed_once_pttl_is_allowed(acl_redis, monkeypatch):
    """A SAQ reader whose PTTL is refused after its baseline: 5 real jobs finish, their
    completions are counted, no runtime is observed and the reader says why. Once +pttl is
    allowed, its next look (LOOK_AGAIN_AFTER after the refused one; 0 s here) observes the 5
    finished meanwhile, once: their records are still kept."""
    from exporter.redis.connection import RedisConnectionConfig
    from exporter.sources.readers import saq_jobs
    from exporter.sources.readers.config import SaqReaderConfig
    from exporter.sources.readers.framework import Signals
    from exporter.sources.readers.saq import SaqReader

    admin = acl_redis.client()
    admin.execute_command("ACL", "SETUSER", "reader", "on", ">secret", "~*", "&*", "+@all")
    url = f"redis://reader:secret@127.0.0.1:{acl_redis.port}/0"
    worker, _ = saq_worker(acl_redis.url, "work")
    reader = SaqReader(SaqReaderConfig(queues=["work"]), RedisConnectionConfig(url=url))

    def read() -> tuple[float, int, str | None]:
        signals = Signals()
        reader.read(signals)
        assert signals.tally.invalid == {}
        completed = sum(
            n for (m, _), n in signals.tally.counts.items() if m == "queue_jobs_completed_total"
        )
        timed = sum(
            len(v)
            for (m, _), v in signals.tally.observations.items()
            if m == "queue_job_execution_seconds"
        )
        return completed, timed, signals.silent

    def completed() -> int:
        workers = saq_driver(acl_redis.url, "truth", "work")["queues"]["work"]["workers"]
        return sum(stats["complete"] for stats in workers.values())

    try:
        wait_for(lambda: completed() == 0, timeout=30)  # its stats written: a live worker
        assert read()[:2] == (0, 0)  # the baseline
        admin.execute_command("ACL", "SETUSER", "reader", "-pttl")
        saq_driver(
            acl_redis.url, "enqueue", json.dumps([{"queue": "work", "function": "succeed"}] * 5)
        )
        wait_for(lambda: completed() == 5, timeout=60, interval=0.3)
        reads = [read()]
        while sum(c for c, _, _ in reads) < 5:
            assert len(reads) < 50, reads
            reads.append(read())
        assert sum(t for _, t, _ in reads) == 0
        assert "+pttl" in (reads[-1][2] or "")
        monkeypatch.setattr(saq_jobs, "LOOK_AGAIN_AFTER", 0.0)
        admin.execute_command("ACL", "SETUSER", "reader", "+pttl")
        after = [read(), read()]
        assert [(c, t) for c, t, _ in after] == [(0, 5), (0, 0)], after
        assert after[-1][2] is None
    finally:
        reader.close()
        stop_process(worker, signal.SIGTERM)
