"""External command-line tools the tests run (promtool, amtool, prometheus, chromium)."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import NoReturn

import pytest


def missing(message: str) -> NoReturn:
    """A prerequisite the tests need is not installed: a skip naming it locally, a failure
    under CI (CI=true), which must have everything (scripts/setup.sh installs it)."""
    if os.environ.get("CI") == "true":
        pytest.fail(message + ": CI must have it (scripts/setup.sh installs it)")
    pytest.skip(message)


def require(tool: str) -> str:
    """The tool's path; skip when it is missing locally, fail when it is missing in CI."""
    path = shutil.which(tool)
    if path:
        return path
    missing(f"{tool} not found (scripts/setup.sh installs it from Debian)")


def run(
    *args: str, stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require(args[0]), *args[1:]],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
