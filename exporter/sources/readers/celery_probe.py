"""`check-config --connect` for the Celery reader: the reader run for CELERY_WATCH seconds (two
worker heartbeats), as serve runs it: the workers its inspection found, with their queues and
slots, and a warning for workers that process tasks without sending task events (-E
missing), for tasks whose queue it could not learn, and for a worker of several queues whose
routes cannot be read (what would tell its tasks' queue).
"""

from __future__ import annotations

import time

import redis

from exporter.core.printable import printable
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.probe import Findings, ProbeContext, first_line
from exporter.sources.readers.celery import CeleryReader
from exporter.sources.readers.config import CeleryReaderConfig
from exporter.sources.readers.framework import ReadDeadline, ReaderError, Signals

# Seconds the Celery reader is watched: two worker heartbeats (every 2 s) tell a worker that
# processes tasks without sending task events.
CELERY_WATCH = 5.0


def watch(
    settings: CeleryReaderConfig, connection: RedisConnectionConfig, context: ProbeContext
) -> Findings:
    """The Celery reader, read as serve reads it for CELERY_WATCH seconds: what it found of
    the workers, and what it says it cannot tell."""
    echo, target = context.echo, connection.masked_url()
    findings = Findings()
    reader = CeleryReader(settings, connection, CELERY_WATCH / 2)
    said: dict[str, None] = {}
    try:
        until = time.monotonic() + CELERY_WATCH
        while True:
            signals = Signals(source="native:celery", deadline=ReadDeadline.starting_now(5.0))
            reader.read(signals)
            said.update(dict.fromkeys(w for w in (signals.silent, signals.caveat) if w))
            if time.monotonic() >= until:
                break
            time.sleep(0.5)
    except (redis.RedisError, ReaderError) as error:
        echo(f"native celery at {target}: FAILED ({first_line(error)})")
        return Findings(failures=[f"redis at {target}"])
    finally:
        reader.close()
    workers = reader.workers_inspected()
    for hostname, (queues, slots, routed) in sorted(workers.items()):
        served = ", ".join(printable(q) for q in queues or []) or "?"
        echo(f"  celery worker {printable(hostname)}: queues {served}; slots {slots}")
        if queues and len(queues) > 1 and not routed:
            findings.warnings.append(
                f"celery worker {printable(hostname)} consumes several queues and its "
                "task_routes cannot be read (a function or a class): its tasks' queue is told "
                "only by task-sent events (task_send_sent_event = True on producers) or one "
                "queue per worker; else they count under "
                f'queue="{printable(settings.unknown_queue)}"'
            )
    if settings.inspect and not workers:
        echo(f"  celery: no worker answered Celery's inspection within {CELERY_WATCH:g} s")
    findings.warnings += [f"native celery at {target}: {text}" for text in said]
    return findings
