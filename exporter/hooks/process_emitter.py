"""One EventEmitter per process, made on first use: what a hook in a forking worker needs.

An emitter's flusher is a thread, and a fork copies no thread: an emitter made in a parent
would buffer for ever in its forked children (Celery's prefork pool, RQ's work horses). Each
process that emits gets its own, made lazily (the parent's unsent buffer is not copied), and
closed at its exit so what it buffered is sent, up to `close_timeout`.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import TYPE_CHECKING

from exporter.lifecycle.producer import EventEmitter

if TYPE_CHECKING:
    import redis
    from typing_extensions import Unpack

    from exporter.lifecycle.producer import EmitterOptions

log = logging.getLogger(__name__)


class ProcessEmitter:
    """An EventEmitter per process, all sending to `stream` through `client` (a URL: a client
    with the producer's deadlines; a client: used as given, shared by the forks' own pools)."""

    def __init__(
        self,
        client: redis.Redis | str,
        stream: str,
        close_timeout: float = 2.0,
        **options: Unpack[EmitterOptions],
    ) -> None:
        self.client = client
        self.stream = stream
        self.close_timeout = close_timeout
        self.options = options
        self._emitter: EventEmitter | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def get(self) -> EventEmitter:
        """This process's emitter."""
        emitter, pid = self._emitter, os.getpid()
        if emitter is not None and self._pid == pid:
            return emitter
        with self._lock:
            if self._emitter is None or self._pid != pid:
                self._emitter = EventEmitter(self.client, self.stream, **self.options)
                self._pid = pid
                atexit.register(self.close)
            return self._emitter

    def close(self) -> None:
        """Send what this process buffered (up to close_timeout), stop its flusher and log
        what was sent and dropped: drops during an outage are named once, at the end."""
        emitter = self._emitter
        if emitter is None or self._pid != os.getpid():
            return
        emitter.close(self.close_timeout)
        self._emitter = None
        level = logging.WARNING if emitter.dropped else logging.INFO
        log.log(
            level,
            "lifecycle events to %s: %d sent, %d dropped %s",
            self.stream,
            emitter.sent,
            emitter.dropped,
            dict(sorted(emitter.dropped_by_reason.items())),
        )
