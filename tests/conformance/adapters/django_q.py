"""django-q2 1.11 (Django 5.2) with its Redis broker, its tasks queued by async_task and run by
real `qcluster` workers (tests/djangoq_app); the truth is its own broker's queue_size(),
Stat.get_all() (the live clusters) and its result rows, and each queue's head task's queue
time as the clock saw async_task called."""

from __future__ import annotations

import math
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

from tests.conformance.adapters.base import Adapter, TruthAt, fixed
from tests.conformance.checks import Age, Truth
from tests.conftest import stop_process, wait_for
from tests.djangoq_app.control import DEFAULT, DjangoQ

REPORTS = "reports"  # a second site, Q_CLUSTER name "reports"


class DjangoQAdapter(Adapter):
    system = "django_q"

    def phases(self) -> Iterator[TruthAt]:
        django_q = DjangoQ(self.backend_url, self.tmp_path / "django.sqlite3")
        clusters: list[subprocess.Popen[bytes]] = []
        try:
            # "reports": its cluster completes two tasks and fails one; it keeps running, so its
            # emptied queue (its list gone) is still found through its cluster key
            reports = django_q.cluster(REPORTS)
            clusters.append(reports)
            django_q.driver(REPORTS, "enqueue", "succeed", "2")
            django_q.driver(REPORTS, "enqueue", "fail", "1")
            settled(django_q, REPORTS, queued=0, succeeded=2, failed=1, clusters=True)
            # "default" (the library's own name), no cluster: three tasks wait
            queued = django_q.driver(DEFAULT, "enqueue", "succeed", "3")
            library = {site: django_q.driver(site, "truth") for site in (DEFAULT, REPORTS)}
            assert library[DEFAULT]["version"].startswith("1.11"), library
            assert library[DEFAULT]["list_key"] == "django_q:default:q", library
            yield fixed(self.truth(library, {DEFAULT: queued}))
            # the default cluster runs them; the reports cluster stops: its key expires, and
            # its queue, empty and with no cluster, is gone
            clusters.append(django_q.cluster(DEFAULT))
            done = settled(django_q, DEFAULT, queued=0, succeeded=5, clusters=True)
            stop_process(reports, signal.SIGTERM)
            gone = settled(django_q, REPORTS, queued=0, clusters=False)
            yield fixed(self.truth({DEFAULT: done, REPORTS: gone}, {}))
        finally:
            for cluster in clusters:
                stop_process(cluster, signal.SIGTERM)

    @staticmethod
    def truth(library: dict[str, dict[str, Any]], queued: dict[str, dict[str, float]]) -> Truth:
        """A site's queue is found while its list holds tasks or a cluster of it is live; its
        depth is queue_size(); the oldest waiting task's age from when its async_task was
        called (signed in whole seconds: from the second the first call began in to the end
        of the last)."""
        depths: dict[tuple[str, ...], float] = {}
        ages: dict[tuple[str, ...], Age | None] = {}
        for site, view in library.items():
            if view["queued"] or view["clusters"]:
                depths[site, "pending"] = view["queued"]
                ages[site, "pending"] = None
        for site, window in queued.items():
            if depths.get((site, "pending")):
                ages[site, "pending"] = Age(math.floor(window["before"]), window["after"])
        taken_at = min(view["now"] for view in library.values())
        return Truth("django_q", taken_at, depths, exact_states=True, ages=ages, exact_ages=True)


def settled(django_q: DjangoQ, site: str, **wanted: Any) -> dict[str, Any]:
    """The site's truth once it says what `wanted` says (clusters: whether any is live)."""

    def read() -> dict[str, Any] | None:
        library = django_q.driver(site, "truth")
        seen = {**library, "clusters": bool(library["clusters"])}
        return library if all(seen[name] == value for name, value in wanted.items()) else None

    found: dict[str, Any] = wait_for(read, timeout=60, interval=0.5)
    return found
