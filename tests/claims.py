"""Claims on what test processes share, made so that none outlives a killed test.

- A Redis database of the shared server (conftest.py's redis_db) is claimed by a key naming
  its holder and a deadline, moved on by a thread while the test holds it: a killed test's
  claim runs out, and the next claimer flushes what it left.
- A port (private_redis.free_port) is claimed by a file naming the claiming process: no other
  test process is handed it while that process lives, and a dead process's claim is taken over.
- A PostgreSQL database (conftest.py's postgres_dsn) is named after its process: databases of
  processes no longer alive are dropped by the next test that creates one.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import redis

CLAIM_KEY = "queue-exporter-test:claimed"  # "<holder>|<deadline, server ms>"
CLAIM_TTL_MS = 30_000

# A database is free when it holds nothing, or only what a test whose claim ran out left (then
# flushed); one holding keys but no claim is someone else's and left alone. A claim without a
# deadline (an older conftest's) is respected forever.
_NOW_MS = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
"""
_CLAIM = (
    _NOW_MS
    + """
local held = redis.call('GET', KEYS[1])
if held then
  local holder, deadline = string.match(held, '^(.*)|(%d+)$')
  if not holder or tonumber(deadline) > now_ms then return 0 end
  redis.call('FLUSHDB')
elseif redis.call('DBSIZE') > 0 then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. (now_ms + tonumber(ARGV[2])))
return 1
"""
)
# Keep a claim: again if the test flushed its own database, never over another holder's.
_REFRESH = (
    _NOW_MS
    + """
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, string.len(ARGV[1]) + 1) ~= ARGV[1] .. '|' then return 0 end
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. (now_ms + tonumber(ARGV[2])))
return 1
"""
)

# A test emptying its own database mid-test (a Hypothesis example each): in one step with its
# claim put back, so no other test process finds the database empty and unclaimed meanwhile
# (it would claim it, and each test would then flush the other's keys).
_FLUSH_KEEPING_CLAIM = """
local held = redis.call('GET', KEYS[1])
redis.call('FLUSHDB')
if held then redis.call('SET', KEYS[1], held) end
"""


def flush_keeping_claim(client: redis.Redis) -> None:
    """FLUSHDB of the test's own claimed database, the claim kept (never a bare FLUSHDB)."""
    client.eval(_FLUSH_KEEPING_CLAIM, 1, CLAIM_KEY)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def redis_database(host: str, port: int) -> Iterator[int]:
    """A database number of the server at host:port held for the block, then flushed."""
    holder = f"{os.getpid()}:{uuid.uuid4().hex}"
    db = _claim_database(host, port, holder)
    stop = threading.Event()
    refresher = threading.Thread(
        target=_hold, args=(host, port, db, holder, stop), name=f"redis-db-{db}", daemon=True
    )
    refresher.start()
    try:
        yield db
    finally:
        stop.set()
        refresher.join()
        with redis.Redis(host=host, port=port, db=db) as client:
            client.flushdb()


def _claim_database(host: str, port: int, holder: str) -> int:
    for db in range(15, 0, -1):
        with redis.Redis(host=host, port=port, db=db) as client:
            if try_claim(client, holder):
                return db
    raise RuntimeError(f"no Redis database of {host}:{port} left for the test (all 15 claimed)")


def try_claim(client: redis.Redis, holder: str) -> bool:
    """Claim the client's database for `holder` if it is free (flushing what a holder whose
    claim ran out left); False when someone holds it or it holds someone's keys."""
    return bool(client.eval(_CLAIM, 1, CLAIM_KEY, holder, CLAIM_TTL_MS))


def _hold(host: str, port: int, db: int, holder: str, stop: threading.Event) -> None:
    """Refresh the claim until stopped (again if the test flushed its own database)."""
    with redis.Redis(host=host, port=port, db=db, socket_timeout=5) as client:
        while not stop.wait(CLAIM_TTL_MS / 3000):
            with contextlib.suppress(redis.RedisError):  # the next round tries again
                client.eval(_REFRESH, 1, CLAIM_KEY, holder, CLAIM_TTL_MS)


_PORTS = Path(tempfile.gettempdir()) / "queue-exporter-test-ports"


def claim_port(port: int) -> bool:
    """Claim `port` for this process; False when a live process holds it."""
    _PORTS.mkdir(exist_ok=True)
    path = _PORTS / str(port)
    for _ in range(3):
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner = path.read_text() if path.exists() else ""
            if not owner.isdigit() or _alive(int(owner)):
                return False  # held, or being written by its claimer right now
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # its process is gone
            continue
        with os.fdopen(descriptor, "w") as claim:
            claim.write(str(os.getpid()))
        return True
    return False


def postgres_database_name() -> str:
    """A name for a test database: its process's id in it, so a dead process's can be found."""
    return f"qe_test_p{os.getpid()}_{uuid.uuid4().hex[:8]}"


_NAMED = re.compile(r"qe_test_p(?P<pid>\d+)_[0-9a-f]{8}")


def drop_dead_databases(admin: psycopg.Connection[Any]) -> None:
    """Drop the test databases whose processes are gone (a killed test's)."""
    names = admin.execute("SELECT datname FROM pg_database WHERE datname LIKE 'qe_test_p%'")
    for (name,) in names.fetchall():
        match = _NAMED.fullmatch(str(name))
        if match is not None and not _alive(int(match.group("pid"))):
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
