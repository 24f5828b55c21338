"""The tests' side of the PgQueuer app: its driver and worker as subprocesses of the pgqueuer1
venv's Python (the pytest process never imports PgQueuer, whose pins differ from the project's)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict

from tests.tools import missing

ROOT = Path(__file__).resolve().parent.parent.parent
PYTHON = ROOT / ".venv/tools/pgqueuer1/bin/python"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def url(dsn: str) -> str:
    """A libpq DSN as a URL: asyncpg reads no keyword string."""
    parts = conninfo_to_dict(dsn)
    user, host, port = parts.get("user", ""), parts.get("host", ""), parts.get("port", "")
    return f"postgresql://{user}@{host}:{port}/{parts['dbname']}"


def require() -> None:
    """A skip naming the pgqueuer1 venv when it is missing (a failure under CI)."""
    if not PYTHON.exists():
        missing(f"PgQueuer: no {PYTHON} (scripts/setup.sh installs it)")


def driver(dsn: str, *args: str) -> Any:
    """tests/pgqueuer_app/driver.py's command; what it printed, as JSON (None for nothing)."""
    require()
    done = subprocess.run(
        [PYTHON, "-m", "tests.pgqueuer_app.driver", url(dsn), *args],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout) if done.stdout.strip() else None


def worker(dsn: str, release: Path) -> subprocess.Popen[bytes]:
    """A real PgQueuer worker (PgQueuer.run); its `hold` jobs run until `release` exists."""
    require()
    return subprocess.Popen(
        [PYTHON, "-m", "tests.pgqueuer_app.driver", url(dsn), "worker", str(release)],
        env=ENV,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
