"""A TCP forwarder on 127.0.0.1 that a test can cut, restore, freeze and thaw: a backend
"unreachable" or "hung" without touching the shared servers.

cut() is a backend that went away (connections break, new ones are refused). freeze() is a
backend that hangs: every socket stays open and new connections are accepted, but nothing is
forwarded either way, so the client's kernel sees a healthy TCP peer and only a client-side
deadline can notice. thaw() forwards again, what was held included.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from tests.private_redis import free_port


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._accepter: threading.Thread | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._running = threading.Event()
        self._flowing = threading.Event()
        self._flowing.set()
        self._held = 0  # chunks that arrived while frozen, not forwarded (yet)
        # Per connection: the Redis command of its last request, while no reply came back since.
        self._awaiting: dict[int, str | None] = {}

    def start(self) -> TcpProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        listener.settimeout(0.05)  # accept() polls, so cut() never waits on a blocked accept
        self._running.set()
        self._accepter = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._accepter.start()
        return self

    def cut(self) -> None:
        """Refuse new connections and break every open one. Once it returns the port is free:
        start() binds it again at once."""
        self._running.clear()
        accepter, self._accepter = self._accepter, None
        if accepter is not None:
            # The accept thread closes its listener itself. Closed from here, the listener
            # stayed listening while that thread's poll held it (up to its 50 ms), and a
            # start() within that time failed with EADDRINUSE.
            accepter.join()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _close(sock)
        self._flowing.set()  # frozen pumps wake up, find their sockets closed and end

    def freeze(self) -> None:
        """Stop forwarding in both directions; sockets stay open, new ones are accepted."""
        self._flowing.clear()

    def held(self) -> int:
        """How many chunks arrived while frozen: a test waits for the request it means to
        hang to be held here, instead of sleeping until it probably is."""
        with self._lock:
            return self._held

    def awaiting(self) -> set[str]:
        """The Redis commands (RESP: the first of a request) the clients wait on: sent (held
        here while frozen, or forwarded before) with no reply come back since. A test waits for
        each client it means to hang (the lease's EVALSHA, a consumer's XREAD, a sampler's SCAN)
        to show here, instead of sleeping until it probably does."""
        with self._lock:
            return {command for command in self._awaiting.values() if command}

    def thaw(self) -> None:
        """Forward again, starting with what was held while frozen."""
        self._flowing.set()

    def _accept(self, listener: socket.socket) -> None:
        with listener:
            while self._running.is_set():
                try:
                    client, _ = listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                try:
                    upstream = socket.create_connection(self.target, timeout=5)
                except OSError:
                    _close(client)
                    continue
                client.settimeout(None)
                upstream.settimeout(None)
                with self._lock:
                    self._sockets += [client, upstream]
                for source, target, request in (
                    (client, upstream, True),
                    (upstream, client, False),
                ):
                    pump = threading.Thread(
                        target=self._pump, args=(source, target, request), daemon=True
                    )
                    pump.start()

    def _pump(self, source: socket.socket, target: socket.socket, request: bool) -> None:
        """Forward source's bytes to target; `request`: source is the client."""
        connection = id(source if request else target)
        try:
            while data := source.recv(65536):
                with self._lock:
                    if request:
                        self._awaiting[connection] = _resp_command(data)
                    if not self._flowing.is_set():
                        self._held += 1
                self._flowing.wait()  # held while frozen; cut() sets it to end the pump
                target.sendall(data)
                if not request:
                    with self._lock:
                        self._awaiting.pop(connection, None)
        except OSError:
            pass
        with self._lock:
            self._awaiting.pop(connection, None)
        _close(source)
        _close(target)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def _resp_command(chunk: bytes) -> str | None:
    """The first command of a RESP request (`*N\\r\\n$L\\r\\nNAME...`), else None."""
    parts = chunk.split(b"\r\n", 3)
    if len(parts) < 3 or not parts[0].startswith(b"*") or not parts[1].startswith(b"$"):
        return None
    return parts[2].decode("ascii", "replace").upper()
