"""The rq preset's queues param against real RQ and its `rq worker`, under every installed major.

Every state, count, age and worker as RQ's own Queue.count and registries give them is checked
by the conformance harness (tests/conformance/adapters/rq.py), whose drivers these tests use.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.adapters.base import require
from tests.conformance.adapters.rq import RQ_PYTHONS, rq_worker, stop_rq_worker
from tests.conftest import REAL_WORKER_INTERVAL, scrape_series, wait_for


@pytest.fixture(params=sorted(RQ_PYTHONS), ids=lambda major: f"rq{major}")
def rq_python(request: pytest.FixtureRequest) -> Path:
    return require(RQ_PYTHONS[request.param], "rq", f"rq{request.param}")


def test_a_queues_param_narrows_the_workers_too(rq_python, redis_url, run_exporter):
    """queues: [mail]: a worker serving mail and video (its rq:worker hash lists both) is a
    worker of mail alone, as the depths are; stopped, it leaves mail's workers."""
    preset = {"name": "rq", "params": {"queues": ["mail"]}}
    sources = {"redis": {"url": redis_url}}
    app = run_exporter(
        {"presets": [preset], "sources": sources, "sample_interval": REAL_WORKER_INTERVAL}
    )
    worker = rq_worker(rq_python, redis_url, "mail", "video", burst=False)

    def workers() -> dict[str, float]:
        series = scrape_series(app)
        return {
            dict(ls)["queue"]: v
            for (n, ls), v in series.items()
            if n == "queue_workers" and {("system", "rq"), ("state", "idle")} <= ls
        }

    try:
        assert wait_for(workers, timeout=120) == {"mail": 1}  # one read gives both, or neither
    finally:
        stop_rq_worker(worker)
    wait_for(lambda: not workers(), timeout=120)
