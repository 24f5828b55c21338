"""Queue django-q2 tasks and read django-q2's own view of its clusters, with the django-q2 of
this Python (settings: tests/djangoq_app/settings.py, from the environment).

    python -m tests.djangoq_app.driver enqueue FUNCTION COUNT
    python -m tests.djangoq_app.driver truth

`enqueue` queues COUNT tasks (async_task) and prints the time before the first and after the
last. `truth` prints the site's broker list and its length (the broker's queue_size()), the
live clusters (Stat.get_all()), the saved results (Success and Failure rows) and the versions.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import django

django.setup()

from django_q import VERSION  # noqa: E402 (after django.setup())
from django_q.brokers import get_broker  # noqa: E402
from django_q.models import Failure, Success  # noqa: E402
from django_q.status import Stat  # noqa: E402
from django_q.tasks import async_task  # noqa: E402


def enqueue(function: str, count: int) -> dict[str, float]:
    before = time.time()
    for _ in range(count):
        async_task(f"tests.djangoq_app.tasks.{function}")
    return {"before": before, "after": time.time()}


def truth() -> dict[str, Any]:
    broker = get_broker()
    return {
        "version": ".".join(map(str, VERSION)),
        "django": django.get_version(),
        "now": time.time(),
        "list_key": broker.list_key,
        "queued": broker.queue_size(),
        "clusters": [str(stat.cluster_id) for stat in Stat.get_all(broker)],
        "succeeded": Success.objects.count(),
        "failed": Failure.objects.count(),
    }


def main() -> None:
    command, *args = sys.argv[1:]
    if command == "enqueue":
        print(json.dumps(enqueue(args[0], int(args[1]))))
    elif command == "truth":
        print(json.dumps(truth()))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
