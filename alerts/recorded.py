"""What each queue system's exporter serves that the alerts read, recorded from a real run.

tests/conformance/test_conformance.py hands every case's defaults run (the preset's defaults
against the real library and workers) to `record_or_compare`, as tests/demo/test_demo.py does for the
seed systems (Attune, Orchestrata, Runner-Q: on no conformance harness, fed by the demo): with QE_RECORD_SERIES=1 the
series it served (each phase's scrape once the phase agreed with the library) are written to
alerts/tests/recorded/<case>.json; otherwise they are compared with that file, and a change in
what the system serves fails the run, saying how to record it again. Only the series the alerts
read are kept (`alert_inputs`), by name and labels: values change from run to run, and the
promtool tests built on them (alerts/systems.py) script values of their own.

The comparison is of structure: each metric served both in the recording and in the run must
carry the same label names (an alert matches on them: a queue label gone from the workers
silences QueueNoWorkers). Which series a run shows at all can be timing (whether a worker was
busy at a scrape), so presence is not compared: the
conformance truths and the signals check hold it, and recording again updates it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from alerts.alerting import alerting_rules
from alerts.config import DEFAULTS
from alerts.recording import recording_rules
from exporter.output.catalog import BY_NAME

RECORDED_DIR = Path(__file__).resolve().parent / "tests" / "recorded"
RECORD_ENV = "QE_RECORD_SERIES"
# The labels whose values are part of a series' shape: what an alert means depends on them.
SHAPE_VALUES = ("system", "state")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")

Labels = Mapping[str, str]
LabelPairs = tuple[tuple[str, str], ...]
Shape = tuple[str, LabelPairs]
# A scrape's series, as tests/conftest.py parses them: (name, label pairs) -> value.
Scraped = Iterable[tuple[str, Iterable[tuple[str, str]]]]


@dataclass(frozen=True)
class Recording:
    """One case's recorded series: `system` as the exporter names it, `case` the conformance
    case (system and major), `source` how it was recorded."""

    system: str
    case: str
    source: str
    series: tuple[tuple[str, LabelPairs], ...]

    def of(self, name: str) -> list[dict[str, str]]:
        return [dict(labels) for metric, labels in self.series if metric == name]


# Records every case at once (a few minutes on two workers).
RECORD_ALL = f"{RECORD_ENV}=1 bash scripts/test.sh -n 2 tests/conformance"


# Where a recording comes from, other than a conformance case: the seed systems, on no
# conformance harness, from the demo's run (tests/demo/test_demo.py).
RECORDED_BY = {"demo": "tests/demo/test_demo.py -k embedded"}


def record_command(case: str, source: str = "conformance") -> str:
    where = RECORDED_BY.get(source, f"tests/conformance -k {case}")
    return f"{RECORD_ENV}=1 bash scripts/test.sh {where}"


@cache
def alert_inputs() -> frozenset[str]:
    """The exported series the alerts read, directly or through recording rules."""
    recorded = {rule.record: rule.expr for rule in recording_rules(DEFAULTS)}
    exported = set(BY_NAME) | {f"{name}_bucket" for name in BY_NAME}
    found: set[str] = set()

    def read(expr: str) -> None:
        for name in _NAME.findall(expr):
            if name in recorded:
                read(recorded.pop(name))
            elif name in exported:
                found.add(name)
        # {__name__=~"a|b"}: the names inside the regular expression
        for alternatives in re.findall(r'__name__=~"([^"]+)"', expr):
            found.update(name for name in alternatives.split("|") if name in exported)

    for alert in alerting_rules(DEFAULTS):
        read(alert.expr)
    return frozenset(found)


def kept(served: Scraped) -> list[tuple[str, LabelPairs]]:
    """The served series the alerts read, each once, sorted."""
    inputs = alert_inputs()
    unique = {(name, tuple(sorted(labels))) for name, labels in served if name in inputs}
    return sorted(unique)


def shapes(series: Scraped) -> set[Shape]:
    return {
        (name, tuple(sorted((k, v if k in SHAPE_VALUES else "*") for k, v in labels)))
        for name, labels in series
    }


def path_of(case: str) -> Path:
    return RECORDED_DIR / f"{case}.json"


def write(recording: Recording) -> None:
    document = {
        "system": recording.system,
        "case": recording.case,
        "source": recording.source,
        "series": [{"name": name, "labels": dict(labels)} for name, labels in recording.series],
    }
    RECORDED_DIR.mkdir(parents=True, exist_ok=True)
    path_of(recording.case).write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")


def load(path: Path) -> Recording:
    document = json.loads(path.read_text())
    series = tuple(
        (entry["name"], tuple(sorted(entry["labels"].items()))) for entry in document["series"]
    )
    return Recording(document["system"], document["case"], document["source"], series)


def recordings() -> list[Recording]:
    return [load(path) for path in sorted(RECORDED_DIR.glob("*.json"))]


def record_or_compare(
    case: str, system: str, source: str, scrapes: Iterable[Scraped]
) -> str | None:
    """Record the series of `scrapes` (QE_RECORD_SERIES=1), or compare their shapes with the
    recording: None when they agree (or were recorded), else what differs and how to record."""
    served = kept((name, labels) for scrape in scrapes for name, labels in scrape)
    recording = Recording(system, case, source, tuple(served))
    if os.environ.get(RECORD_ENV) == "1":
        write(recording)
        return None
    path = path_of(case)
    if not path.exists():
        command = record_command(case, source)
        return f"no recording of {case} in {path.name}: record it with `{command}`"
    changed = _changed_structure(load(path).series, served)
    if not changed:
        return None
    return (
        f"{case} serves its series with other labels than alerts/tests/recorded/{path.name} "
        f"(the alerts' table and promtool tests are built on it): {'; '.join(changed)}. "
        f"Record again with `{record_command(case, source)}`, then run `python -m alerts`."
    )


def _changed_structure(
    before: Iterable[tuple[str, LabelPairs]], now: Iterable[tuple[str, LabelPairs]]
) -> list[str]:
    """Each metric served both then and now whose label names differ (a queue label gone from
    the workers, a label renamed): what an alert's expression matches on. Which series a run
    shows at all is timing (whether a worker was busy at a scrape, whether the scenario's
    events fell after the exporter's first read), so presence is compared by recording again,
    not here: the conformance truths and the signals check (`unnamed_signals`) hold it."""

    def structure(series: Iterable[tuple[str, LabelPairs]]) -> dict[str, set[tuple[str, ...]]]:
        found: dict[str, set[tuple[str, ...]]] = {}
        for name, labels in series:
            found.setdefault(name, set()).add(tuple(sorted(k for k, _ in labels)))
        return found

    then, served = structure(before), structure(now)
    return [
        f"{name}: labels {sorted(served[name])}, recorded {sorted(then[name])}"
        for name in sorted(set(then) & set(served))
        if served[name] != then[name]
    ]


def _shown(shape: Shape) -> str:
    name, labels = shape
    return name + "{" + ",".join(f"{k}={v}" if v != "*" else k for k, v in labels) + "}"
