"""Render every dashboard to JSON (`python -m dashboards`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from dashboards import exporter_self, jobs, queues, workers

DASHBOARDS_DIR = Path(__file__).resolve().parent
REPO = DASHBOARDS_DIR.parent

BUILDERS: dict[str, Callable[[], dashboard.Dashboard]] = {
    "queue-exporter-queues.json": queues.build,
    "queue-exporter-jobs.json": jobs.build,
    "queue-exporter-workers.json": workers.build,
    "queue-exporter-self.json": exporter_self.build,
}


# The Grafana these dashboards need: the release whose schema the pinned SDK build emits
# (grafana-foundation-sdk 11.6.0, schemaVersion 41). Grafana's own exports name it the same
# way, in __requires, and refuse nothing older silently: an import shows the requirement.
GRAFANA_VERSION = "11.6.0"


def render(builder: dashboard.Dashboard) -> str:
    document = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    document["__requires"] = [
        {"type": "grafana", "id": "grafana", "name": "Grafana", "version": GRAFANA_VERSION}
    ]
    return json.dumps(document, sort_keys=True, indent=2) + "\n"


def outputs() -> dict[Path, str]:
    return {DASHBOARDS_DIR / name: render(build()) for name, build in BUILDERS.items()}


def load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document
