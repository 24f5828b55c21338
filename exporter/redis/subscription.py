"""A Pub/Sub pattern subscription a reader keeps across its reads, and the gaps in it: the one
way the readers that hear their system's announcements take them (Celery's task events, SAQ's
job status changes).

The subscription has a connection of its own, which a read cut off at its deadline keeps (the
watchdog severs the reader's other connection): what is published meanwhile waits there, in
Redis' output buffer for the subscriber, for the next read. What is published while nobody is
subscribed is not seen, and Redis does not say how much that was. So the subscription tells
where it may have missed some: Redis confirms a subscription once it holds, and every
confirmation after the first (redis-py subscribes again on a new connection after losing its
own: Redis restarted, the subscriber cut off at its output buffer limit, CLIENT KILL; or the
subscription was made anew) is a gap, handed to the reader (`on_gap`) where it happened among
the messages, so that it counts and names it and, where it can, catches up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import redis

from exporter.redis.connection import RedisConnectionConfig

# How long one wait for the next message lasts (what a read that finds none waiting costs).
WAIT = 0.05


class PatternSubscription:
    """PSUBSCRIBE `pattern` on a connection of its own, made at the first `messages()`."""

    def __init__(self, connection: RedisConnectionConfig, pattern: str) -> None:
        self.connection = connection
        self.pattern = pattern
        self.confirmed = False  # a subscription was confirmed: any later confirmation is a gap
        self.made_at: float | None = None  # time.monotonic() when the latest one was made
        self._client: redis.Redis | None = None
        self._pubsub: redis.client.PubSub | None = None

    def messages(
        self, stop: Callable[[], bool], on_gap: Callable[[], None]
    ) -> Iterator[tuple[bytes, bytes]]:
        """(channel, data) of each message waiting, until none waits or `stop()` says so; the
        rest waits for the next call. `on_gap` is called where Redis confirmed a subscription
        after the first. A backend error before any message raises (the caller's read fails
        as its backend does), once a new connection failed too for a lost one; after one, the
        messages given stand and the next call meets it again (redis-py connects and
        subscribes anew there: a gap)."""
        pubsub = self._subscribed()
        given = reconnected = False
        while not stop():
            try:
                message = pubsub.get_message(timeout=WAIT)
            except redis.ResponseError:
                self.close()  # refused (NOPERM): subscribed again at the next call, not never
                raise
            except redis.ConnectionError:
                if not (given or reconnected):
                    reconnected = True  # redis-py connects and subscribes anew now: a gap
                    continue
                if not given:
                    raise
                return
            except redis.RedisError:
                if not given:
                    raise
                return
            if message is None:
                return
            if message["type"] == "psubscribe":
                if self.confirmed:
                    on_gap()
                self.confirmed = True
            elif message["type"] == "pmessage":
                given = True
                yield message["channel"], message["data"]

    def close(self) -> None:
        """Drop the subscription and its connection; the next `messages()` makes a new one
        (whose confirmation is a gap once one was confirmed before)."""
        if self._pubsub is not None:
            self._pubsub.close()
            self._pubsub = None
        if self._client is not None:
            self._client.close()
            self._client = None

    def _subscribed(self) -> redis.client.PubSub:
        if self._pubsub is None:
            if self._client is None:
                self._client = self.connection.connect()
            pubsub = self._client.pubsub()  # type: ignore[no-untyped-call]
            pubsub.psubscribe(self.pattern)
            self._pubsub = pubsub
            self.made_at = time.monotonic()
        return self._pubsub
