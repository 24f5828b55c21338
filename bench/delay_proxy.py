"""A TCP forwarder that delays every chunk by a fixed one-way time: a network between a client
and a Redis on the same host, where no netem qdisc is available.

    python bench/delay_proxy.py LISTEN_PORT TARGET_HOST:TARGET_PORT ONE_WAY_SECONDS

Each direction of each connection has a reader thread, which stamps every chunk it receives
with the time it is due (arrival + the delay), and a writer thread, which sends the chunks in
order, each no earlier than its time. Chunks in flight do not wait for each other, so a
pipelined round is delayed, not throttled: like a link with latency and ample bandwidth. The
delay is a floor: a sleeping thread wakes a little late (tens of microseconds, more on a busy
host), which is why bench/key_sampling.py measures the round trip through it and prints that.

It runs as a process of its own so its CPU is billed to neither side of a benchmark; it prints
"ready" once it listens, and runs until killed or until its standard input closes (the
benchmark that started it ended, however it ended).
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading
import time

CHUNK = 256 * 1024
BUFFER = 4 * 1024 * 1024  # socket buffers: a round of commands is never held back by them


def _pump(source: socket.socket, sink: socket.socket, delay: float) -> None:
    chunks: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()
    threading.Thread(target=_deliver, args=(chunks, sink), daemon=True).start()
    try:
        while data := source.recv(CHUNK):
            chunks.put((time.monotonic() + delay, data))
    except OSError:
        pass
    chunks.put((time.monotonic() + delay, b""))  # the end, in order after the rest


def _deliver(chunks: queue.SimpleQueue[tuple[float, bytes]], sink: socket.socket) -> None:
    try:
        while True:
            due, data = chunks.get()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not data:
                break
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def _connected(client: socket.socket, target: tuple[str, int], delay: float) -> None:
    try:
        server = socket.create_connection(target)
    except OSError:
        client.close()
        return
    for sock in (client, server):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER)
    threading.Thread(target=_pump, args=(client, server, delay), daemon=True).start()
    threading.Thread(target=_pump, args=(server, client, delay), daemon=True).start()


def _exit_with_parent() -> None:
    sys.stdin.buffer.read()  # returns at end of file: whoever held the other end is gone
    os._exit(0)


def main() -> None:
    port, target_text, delay_text = sys.argv[1:4]
    host, _, target_port = target_text.rpartition(":")
    target, delay = (host, int(target_port)), float(delay_text)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", int(port)))
    listener.listen(64)
    threading.Thread(target=_exit_with_parent, daemon=True).start()
    print("ready", flush=True)
    while True:
        client, _ = listener.accept()
        _connected(client, target, delay)


if __name__ == "__main__":
    main()
