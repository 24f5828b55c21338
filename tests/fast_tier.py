"""The fast tier (a pytest plugin, loaded by conftest.py): tests marked `fast` reach no server.

`scripts/test.sh --fast` runs only the tests marked `@pytest.mark.fast` (or a module's
`pytestmark = pytest.mark.fast`): config, presets, exposition, numbers, the wire format, the
key sampler from recorded replies ... in well under a minute, with no Redis, PostgreSQL or
Prometheus (docs/testing.md). So that the mark cannot lie, a marked test that opens a TCP
connection, in any run (the whole suite's too), fails naming the address: its own thread and
the threads it starts are refused; a thread an earlier test left running is not its doing and
is let through. PostgreSQL's libpq connects outside Python's sockets: psycopg's connect is
refused as well. A subprocess a fast test starts is not watched.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

WHY = (
    "a test marked fast reaches no server (tests/fast_tier.py): give it recorded replies, "
    "or take its fast mark off"
)


class ServerReached(ConnectionRefusedError):
    """What a fast test gets for a connection; it also fails the test, even if caught."""


@pytest.fixture(autouse=True)
def _fast_test_reaches_no_server(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    if request.node.get_closest_marker("fast") is None:
        yield
        return
    test_thread = threading.current_thread()
    earlier = {thread for thread in threading.enumerate() if thread is not test_thread}
    reached: list[str] = []

    def refuse(what: str) -> None:
        if threading.current_thread() not in earlier:
            reached.append(what)
            raise ServerReached(f"{what}: {WHY}")

    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def connect(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            refuse(f"connect to {address!r}")
        real_connect(sock, address)

    def connect_ex(sock: socket.socket, address: Any) -> int:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            refuse(f"connect to {address!r}")
        return real_connect_ex(sock, address)

    def postgres_connect(*args: Any, **kwargs: Any) -> Any:
        refuse("a PostgreSQL connection")

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(psycopg, "connect", postgres_connect)
    monkeypatch.setattr(psycopg.Connection, "connect", postgres_connect)
    yield
    if reached:
        pytest.fail(f"{reached[0]} ({len(reached)} in all): {WHY}", pytrace=False)
