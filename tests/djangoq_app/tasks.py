"""The functions real `qcluster` workers run in the tests."""

from __future__ import annotations


def succeed() -> str:
    return "done"


def fail() -> None:
    raise RuntimeError("failing on purpose")
