"""How the suite runs (a pytest plugin, loaded by conftest.py): which tests share a worker
under pytest-xdist, CI's refusal of skipped tests, the Hypothesis profiles, and the logging
state each test gets back.

scripts/test.sh runs `pytest -n 6 --dist loadgroup`: a test runs on any worker unless it has an
`xdist_group` mark, and all tests of one group run on the same worker, one after another.
Groups are given here, so a new test file needs no mark of its own (docs/testing.md):
- a module whose tests share a module- or class-scoped fixture (a Redis Cluster, a web server)
  is one group: the fixture starts once, not once per worker;
- the timing modules (TIMING_MODULES) are one group each: their tests compare durations with a
  reference measured in the same test, and never compete with each other for the CPU.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator

import pytest
from hypothesis import settings

CI = os.environ.get("CI") == "true"

# Tests measuring durations (takeover, deadlines, backlogs): each module on one worker.
TIMING_MODULES = {
    "tests/sources/test_chaos.py",
    "tests/sources/test_deadlines.py",
    "tests/sources/streams/test_events_faults.py",
    "tests/http/test_http_attacks.py",
    "tests/http/test_http_exhaustion.py",
    "tests/leader/test_leader.py",
    "tests/leader/test_lease_overlap.py",
    "tests/redis/test_redis_connections.py",
}

# CI: the same examples every run (a red run reproduces by running it again), the failing
# example printed as a @reproduce_failure blob, no example database carried between runs, and
# no per-example deadline (a busy machine is not a defect). Locally: random examples, the blob
# printed. QE_HYPOTHESIS_PROFILE picks one explicitly.
settings.register_profile("ci", derandomize=True, print_blob=True, database=None, deadline=None)
settings.register_profile("dev", print_blob=True)
HYPOTHESIS_PROFILE = os.environ.get("QE_HYPOTHESIS_PROFILE") or ("ci" if CI else "dev")
settings.load_profile(HYPOTHESIS_PROFILE)


@pytest.fixture(autouse=True)
def _logging_state_restored() -> Iterator[None]:
    """A command run in-process (CliRunner) configures logging for the whole process: the root
    level (check-config sets ERROR), its handlers and the exception hooks. Put back after each
    test, so a later test on the same worker still sees its warnings in caplog."""
    root = logging.getLogger()
    level, handlers = root.level, root.handlers[:]
    hooks = sys.excepthook, threading.excepthook
    yield
    root.setLevel(level)
    root.handlers[:] = handlers
    sys.excepthook, threading.excepthook = hooks
    logging.captureWarnings(False)


def pytest_report_header() -> list[str]:
    how = (
        "derandomized: a failure reproduces by running the same test again"
        if settings.default.derandomize
        else "random examples: a failure prints @reproduce_failure(...) to paste on the test"
    )
    return [f"hypothesis: profile {HYPOTHESIS_PROFILE!r}, {how}"]


def _shared_fixture_module(item: pytest.Item) -> str | None:
    """The module path when the item uses a module- or class-scoped fixture defined there."""
    module = item.nodeid.split("::", 1)[0]
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for definitions in info.name2fixturedefs.values():
        for definition in definitions:
            if definition.scope in ("module", "class") and definition.baseid.startswith(module):
                return module
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        module = item.nodeid.split("::", 1)[0]
        group = module if module in TIMING_MODULES else _shared_fixture_module(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """On a worker, fail a grouped test whose group did not reach the scheduler: pytest-xdist
    passes a group as a suffix of the node id, and a pytest that ignores it (9.2 with
    pytest-xdist 3.8, pytest-xdist#1386) spreads every group over the workers without a word."""
    if not getattr(item.config.option, "loadgroup", False):
        return
    nodeid = item.nodeid
    if item.get_closest_marker("xdist_group") and nodeid.rfind("@") <= nodeid.rfind("]"):
        pytest.fail(
            "this test's xdist_group did not reach pytest-xdist (pytest and pytest-xdist "
            "disagree on node ids, pytest-xdist#1386): use the versions pinned in "
            "constraints/dev.txt",
            pytrace=False,
        )


def _skipped(config: pytest.Config) -> list[pytest.TestReport]:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    return list(reporter.stats.get("skipped", [])) if reporter is not None else []


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under CI a skipped test fails the run: a missing tool or server must not pass quietly."""
    controller = not hasattr(session.config, "workerinput")
    if CI and controller and session.exitstatus == pytest.ExitCode.OK and _skipped(session.config):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    skipped = _skipped(terminalreporter.config)
    if CI and skipped:
        terminalreporter.write_line(
            f"CI=true: {len(skipped)} skipped test(s) fail the run (reasons above, -rs)", red=True
        )
