"""The fast tier's guard (tests/fast_tier.py): a test marked fast that reaches a server fails,
even when it catches the refusal; an unmarked test connects as before."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

TESTS = """
import socket

import pytest


def _connect():
    with socket.socket() as sock:
        sock.settimeout(1)
        try:
            sock.connect(("127.0.0.1", 9))
        except ConnectionRefusedError as error:
            return str(error)


@pytest.mark.fast
def test_marked_and_caught():
    assert "reaches no server" in _connect()


def test_unmarked():
    assert "reaches no server" not in (_connect() or "")
"""


# Not fast itself: its inner unmarked test connects (to a port nothing listens on).
def test_a_fast_test_reaching_a_server_fails(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmarkers =\n    fast: no server\naddopts = --strict-markers\n")
    pytester.makepyfile(TESTS)
    result = pytester.runpytest("-p", "tests.fast_tier")
    result.assert_outcomes(passed=2, errors=1)  # the marked one: its call, then its teardown
    result.stdout.fnmatch_lines(
        ["*connect to ('127.0.0.1', 9)*a test marked fast reaches no server*"]
    )
