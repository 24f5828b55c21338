"""What tests share is claimed so that no claim outlives a killed test (tests/claims.py), and a
private server is proven to be the test's own (tests/private_redis.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis

from tests import claims
from tests.conftest import REDIS_HOST, REDIS_PORT, wait_for
from tests.private_redis import PrivateRedis, free_port

ROOT = Path(__file__).resolve().parents[2]

# A test process that claims a Redis database (a 2 s claim, moved on while it lives), writes
# there and claims a port, says which, then waits to be killed.
HOLDER = textwrap.dedent(f"""
    import time, redis
    from tests import claims
    from tests.private_redis import free_port
    claims.CLAIM_TTL_MS = 5000
    with claims.redis_database({REDIS_HOST!r}, {REDIS_PORT}) as db:
        redis.Redis(host={REDIS_HOST!r}, port={REDIS_PORT}, db=db).set("left:behind", 1)
        print(db, free_port(), flush=True)
        time.sleep(120)
""")


def test_a_killed_tests_database_and_port_are_taken_over() -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER], cwd=ROOT, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert holder.stdout is not None
    db, port = (int(word) for word in holder.stdout.readline().split())
    client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=db)
    try:
        # Refreshed while its test lives: the claim's deadline moves on (the refresh is the
        # marker; a sleep past the first deadline is what a loaded host may not refresh in).
        first = _claim_deadline(client)
        wait_for(lambda: _claim_deadline(client) > first, timeout=60)
        assert not claims.try_claim(client, "someone else")  # held while its test lives
        assert not claims.claim_port(port)
        holder.kill()
        holder.wait()
        # Its claim runs out within its 5 s; the next claimer gets the database, flushed.
        wait_for(lambda: claims.try_claim(client, "someone else"), timeout=60)
        assert client.keys("*") == [claims.CLAIM_KEY.encode()]
        assert claims.claim_port(port)  # its process is gone
    finally:
        holder.kill()
        client.delete(claims.CLAIM_KEY)
        client.close()


def _claim_deadline(client: redis.Redis) -> int:
    """The server time (ms) a database's claim runs to ("<holder>|<deadline>")."""
    held = client.get(claims.CLAIM_KEY)
    assert isinstance(held, bytes)
    return int(held.rsplit(b"|", 1)[1])


def test_a_database_holding_keys_nobody_claimed_is_left_alone() -> None:
    with claims.redis_database(REDIS_HOST, REDIS_PORT) as db:
        client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=db)
        client.delete(claims.CLAIM_KEY)  # as if someone's data sat there unclaimed
        client.set("someones:data", 1)
        assert not claims.try_claim(client, "a test")
        assert client.get("someones:data") == b"1"
        client.close()


def test_a_private_server_on_a_taken_port_is_refused_or_moved(tmp_path: Path) -> None:
    first = PrivateRedis(tmp_path).start()
    try:
        moved = PrivateRedis(tmp_path)
        moved.port = first.port  # as if free_port() had handed out a port taken since
        moved.start()
        assert moved.port != first.port
        assert moved.client().info("server")["process_id"] == moved.process.pid  # type: ignore[union-attr]
        moved.stop()
        with pytest.raises(RuntimeError, match=f"port {first.port} is another process's"):
            PrivateRedis(tmp_path, port=first.port).start()
        assert first.client().ping()  # the other server was never touched
    finally:
        first.stop()


def test_free_ports_are_never_handed_out_twice_while_their_process_lives() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert not any(claims.claim_port(port) for port in ports)  # this process holds them


def test_a_test_emptying_its_own_database_keeps_it() -> None:
    """A test that empties its database mid-test (a Hypothesis example each) still holds it: a
    bare FLUSHDB took the claim too, and another test process could claim the empty database,
    each then flushing the other's keys (load run 1: keys gone under tests on the same db)."""
    with claims.redis_database(REDIS_HOST, REDIS_PORT) as db:
        client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=db)
        client.set("mine", 1)
        claims.flush_keeping_claim(client)
        assert client.keys("*") == [claims.CLAIM_KEY.encode()]
        assert not claims.try_claim(client, "another test")
        client.close()
