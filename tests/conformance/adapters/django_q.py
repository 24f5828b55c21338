"""django-q2 1.11 (Django 5.2) with its Redis broker, its tasks queued by async_task and run by
real `qcluster` workers (tests/djangoq_app, from its venv: scripts/setup.sh); the truth is its
own broker's queue_size(), Stat.get_all() (the live clusters) and its result rows, and each
queue's head task's queue time as the clock saw async_task called."""

from __future__ import annotations

import math
import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

from tests.conformance.adapters.base import ROOT, Adapter, TruthAt, fixed, require, run_json
from tests.conformance.checks import Age, Truth
from tests.conftest import stop_process, wait_for

DJANGOQ_PYTHON = ROOT / ".venv/tools/djangoq/bin/python"
DEFAULT = "default"  # django-q2's Q_CLUSTER name when none is set: its list django_q:default:q
REPORTS = "reports"  # a second site, Q_CLUSTER name "reports"


class DjangoQAdapter(Adapter):
    system = "django_q"

    def _env(self, site: str) -> dict[str, str]:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DJANGO_SETTINGS_MODULE": "tests.djangoq_app.settings",
            "DJANGOQ_REDIS_URL": self.backend_url,
            "DJANGOQ_DB": str(self.tmp_path / "django.sqlite3"),
        }
        if site != DEFAULT:  # the library's default name: no name set
            env["DJANGOQ_NAME"] = site
        return env

    def _driver(self, site: str, *args: str) -> Any:
        argv = [DJANGOQ_PYTHON, "-m", "tests.djangoq_app.driver", *args]
        return run_json(argv, self._env(site))

    def _cluster(self, site: str) -> subprocess.Popen[bytes]:
        """The real `qcluster` command of a site (its sentinel starts the workers)."""
        return subprocess.Popen(
            [DJANGOQ_PYTHON, "-m", "django", "qcluster"],
            env=self._env(site),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _settled(self, site: str, **wanted: Any) -> dict[str, Any]:
        """The site's truth once it says what `wanted` says (clusters: whether any is live)."""

        def read() -> dict[str, Any] | None:
            library = self._driver(site, "truth")
            seen = {**library, "clusters": bool(library["clusters"])}
            return library if all(seen[name] == value for name, value in wanted.items()) else None

        found: dict[str, Any] = wait_for(read, timeout=60, interval=0.5)
        return found

    def phases(self) -> Iterator[TruthAt]:
        require(DJANGOQ_PYTHON, "django_q", "django-q2")
        subprocess.run(
            [DJANGOQ_PYTHON, "-m", "django", "migrate", "-v0"],
            env=self._env(DEFAULT),
            check=True,
            capture_output=True,
        )
        clusters: list[subprocess.Popen[bytes]] = []
        try:
            # "reports": its cluster completes two tasks and fails one; it keeps running, so its
            # emptied queue (its list gone) is still found through its cluster key
            reports = self._cluster(REPORTS)
            clusters.append(reports)
            self._driver(REPORTS, "enqueue", "succeed", "2")
            self._driver(REPORTS, "enqueue", "fail", "1")
            self._settled(REPORTS, queued=0, succeeded=2, failed=1, clusters=True)
            # "default" (the library's own name), no cluster: three tasks wait
            queued = self._driver(DEFAULT, "enqueue", "succeed", "3")
            library = {site: self._driver(site, "truth") for site in (DEFAULT, REPORTS)}
            assert library[DEFAULT]["version"].startswith("1.11"), library
            assert library[DEFAULT]["list_key"] == "django_q:default:q", library
            assert library[REPORTS]["clusters"], library
            yield fixed(self.truth(library, {DEFAULT: queued}))
            # the default cluster runs them; the reports cluster stops: its key expires, and
            # its queue, empty and with no cluster, is gone
            clusters.append(self._cluster(DEFAULT))
            done = self._settled(DEFAULT, queued=0, succeeded=5, clusters=True)
            stop_process(reports, signal.SIGTERM)
            gone = self._settled(REPORTS, queued=0, clusters=False)
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
