"""SAQ's announcements of its jobs' status changes, as the finished jobs' reader takes them
(saq_jobs.py), and the commands only the runtimes need.

SAQ (0.26, saq/queue/redis.py) PUBLISHes a job's status on its key (`notify(job)`: channel
`saq:job:<queue>:<key>`, message the status) once the change is written: after `_finish`'s
MULTI wrote the finished record, in `abort`, `_retry` and `_update`. A read takes what waits on
the subscription (subscription.py) into `waiting`: each job announced finished, and each job
announced in another status that the reader remembers finished (a key enqueued again), to be
read; they stay there until a read that read them succeeded, so a read that fails after it
took them loses none. Each gap in the subscription makes a look due (saq_jobs.py), and so
does the first subscription: the look that takes the baseline comes after Redis confirmed it.
"""

from __future__ import annotations

import logging
from collections.abc import Container

import redis

from exporter.core.logs import LogLimiter
from exporter.redis.connection import RedisConnectionConfig
from exporter.redis.subscription import PatternSubscription
from exporter.sources.readers.framework import MAX_NAME_BYTES, Signals

log = logging.getLogger(__name__)
_limited = LogLimiter(log)

JOB_PREFIX = "saq:job:"
JOB_CHANNELS = f"{JOB_PREFIX}*"
FINISHED = ("complete", "failed", "aborted")
# Announced jobs waiting to be read, at most (a key each, about 150 bytes: 75 MB). Beyond, a
# read takes no more: they wait in Redis, until its output buffer limit for subscribers cuts
# the subscription off (a gap, counted, caught up by a look).
MAX_ANNOUNCED = 500_000
RUNTIMES = 'queue_job_execution_seconds, queue_job_wait_seconds and queue_depth{state="failed"}'


class CommandRefused(Exception):
    """A command only the runtimes and the failed count need was refused (the ACL, or a
    server without it): they are not served, every other series is."""

    def __init__(self, command: str, error: Exception) -> None:
        self.command = command
        lines = str(error).splitlines()
        first_line = lines[0][:200] if lines else type(error).__name__
        name = command.upper()
        where = f"&{JOB_CHANNELS}" if command == "psubscribe" else f"on {JOB_CHANNELS}"
        super().__init__(
            f"{name} refused ({first_line}): {RUNTIMES} are not served, every other series is; "
            f"the ACL needs +{command} {where} (or the server its {name} command)"
        )


def refused(error: Exception) -> bool:
    """A command refused: by the ACL (NOPERM), or unknown to the server (renamed)."""
    text = str(error).lower()
    return isinstance(error, redis.exceptions.NoPermissionError) or text.startswith(
        ("noperm", "unknown command")
    )


def refusal(command: str, error: Exception) -> Exception:
    """What an error reply of a command only runtimes need raises."""
    return CommandRefused(command, error) if refused(error) else error


class Announcements:
    """The jobs SAQ announced that a read has yet to read, and whether a look is due."""

    def __init__(self, connection: RedisConnectionConfig) -> None:
        self._subscription = PatternSubscription(connection, JOB_CHANNELS)
        self.waiting: dict[str, None] = {}  # job keys, the oldest announced first
        self.look_due = True  # the baseline's; again after each gap
        self.interrupted = False  # by the watchdog or a shutdown: taking stops

    @property
    def confirmed(self) -> bool:
        """Redis confirmed the subscription: what is published from now on is heard."""
        return self._subscription.confirmed

    def take(self, remembered: Container[str], signals: Signals) -> None:
        """What waits on the subscription, until none waits, MAX_ANNOUNCED wait to be read,
        the read's deadline passes or the watchdog interrupts it. PSUBSCRIBE refused raises
        CommandRefused; a lost connection raises when nothing was taken (a gap next time)."""
        oversized = 0

        def stop() -> bool:
            full = len(self.waiting) >= MAX_ANNOUNCED
            return full or self.interrupted or signals.deadline.passed()

        messages = self._subscription.messages(stop, lambda: self._on_gap(signals))
        try:
            for channel, status in messages:
                if len(channel) > MAX_NAME_BYTES:
                    oversized += 1  # refused before anything parses it
                    continue
                key = channel.decode("utf-8", "replace")
                if status.decode("utf-8", "replace") in FINISHED or key in remembered:
                    self.waiting[key] = None
        except redis.ResponseError as error:
            raise refusal("psubscribe", error) from error
        if oversized:
            detail = f"{oversized} over {MAX_NAME_BYTES} bytes"
            signals.refuse_beyond("oversized_field", "job keys announced", detail)

    def add(self, key: str) -> None:
        """A job to read as if announced (one a look found finished and not seen)."""
        self.waiting[key] = None

    def read(self, keys: list[str], signals: Signals) -> None:
        """These were read: no longer waiting once the read succeeded."""

        def done() -> None:
            for key in keys:
                self.waiting.pop(key, None)

        signals.on_success(done)

    def looked(self, signals: Signals) -> None:
        """A look was made (after this read took what waited): none is due once the read
        succeeded."""

        def done() -> None:
            self.look_due = False

        signals.on_success(done)

    def close(self) -> None:
        self._subscription.close()

    def _on_gap(self, signals: Signals) -> None:
        signals.tally.lost += 1  # how many announcements the gap held, Redis does not tell
        _limited.warning(
            (id(self), "gap"),
            "saq: the subscription to job announcements was lost and made again: jobs that "
            "finished in between are looked for (one gap counted in "
            "queue_exporter_events_lost_total) [resubscribed]",
        )
        self.look_due = True
