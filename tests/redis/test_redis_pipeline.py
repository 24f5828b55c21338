"""One MULTI/EXEC in one round trip (exporter.redis.pipeline.transaction), against a real Redis."""

from __future__ import annotations

import pytest
import redis

from exporter.redis.pipeline import transaction


def test_a_command_that_fails_while_the_others_run_gives_its_error_in_place(redis_client):
    replies = transaction(redis_client, [("SET", "k", "v"), ("LPUSH", "k", "x"), ("GET", "k")])
    assert replies[0] == b"OK" and replies[2] == b"v"
    assert isinstance(replies[1], redis.ResponseError) and "WRONGTYPE" in str(replies[1])


def test_a_transaction_redis_refuses_whole_raises_the_refused_command_s_error(redis_client):
    with pytest.raises(redis.ResponseError, match="xack") as refused:
        transaction(redis_client, [("SET", "k", "v"), ("XACK", "stream")])
    assert "EXECABORT" not in str(refused.value)
    assert redis_client.get("k") is None  # nothing of it ran


def test_errors_are_those_redis_py_raises(redis_client):
    [reply] = transaction(redis_client, [("EVALSHA", "0" * 40, 0)])
    assert isinstance(reply, redis.exceptions.NoScriptError)
