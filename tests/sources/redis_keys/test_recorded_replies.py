"""The key sampler's reads and reply handling, from replies a real Redis gave (recorded/).

Each scenario (recorded/scenarios.py: Orchestrata's and Runner-Q's layouts from the seed
documents, RQ's documented one) is replayed through the sampler's own code: the reads
commands.py builds must be the ones recorded, round by round as rounds.py makes them, and the
replies must come out as the depths, ages, due counts and errors of what was written into
Redis (the scenario's truth, never the exporter's output). No server: recorded/record.py made
the recordings, test_recordings_current.py checks they still hold on a live Redis.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from exporter.output.catalog import BY_NAME
from exporter.sources.redis_keys.commands import DEPTH, OLDEST_AGE, Cycle
from exporter.sources.redis_keys.types import Labels
from tests.sources.redis_keys.recorded import wire
from tests.sources.redis_keys.recorded.scenarios import SCENARIOS, Scenario

pytestmark = pytest.mark.fast


@pytest.fixture(params=sorted(SCENARIOS))
def replayed(request: pytest.FixtureRequest) -> tuple[Scenario, Cycle]:
    scenario = SCENARIOS[request.param]
    return scenario, wire.replay(scenario, wire.load(scenario.name))


def _series(scenario: Scenario, table: dict[Any, float]) -> dict[tuple[str, ...], float]:
    """A table's series of the scenario's system, by (queue, priority, state)."""
    rows = {Labels(*labels): value for labels, value in table.items()}
    assert {labels.system for labels in rows} <= {scenario.system}
    return {(labels.queue, labels.priority, labels.state): value for labels, value in rows.items()}


def test_depths_are_the_items_written(replayed):
    scenario, cycle = replayed
    assert _series(scenario, cycle.samples.table(DEPTH)) == scenario.truth.depths


def test_ages_are_the_oldest_items_written(replayed):
    scenario, cycle = replayed
    ages = _series(scenario, cycle.samples.table(OLDEST_AGE))
    assert ages == pytest.approx(scenario.truth.ages, abs=1e-3)


def test_due_counts_are_the_members_past_due(replayed):
    scenario, cycle = replayed
    due = {
        (name, queue): value
        for name in ("queue_scheduled_due", "queue_leases_expired")
        for (system, queue), value in cycle.samples.table(BY_NAME[name]).items()
        if system == scenario.system
    }
    assert due == scenario.truth.due


def test_each_unreadable_key_is_counted_once_under_its_reason(replayed):
    scenario, cycle = replayed
    errors = {tally.group.pattern: dict(tally.errors) for tally in cycle.tallies}
    assert errors == {pattern: scenario.truth.errors.get(pattern, {}) for pattern in errors}


def test_a_key_of_another_type_is_named_with_the_type_it_holds():
    """WRONGTYPE to LLEN and to the head's read inside the script: one failure, and its TYPE
    (a follow-up round) names what the key holds."""
    scenario = SCENARIOS["orchestrata"]
    cycle = wire.replay(scenario, wire.load("orchestrata"))
    tally = next(t for t in cycle.tallies if t.group.pattern.startswith("orchestrata:queue:"))
    assert ("wrong_type", b"orchestrata:queue:wrongtype:p0") in tally.failed_keys
    report = tally.report()
    assert report.keys_matched == len([k for k in scenario.found_keys() if b":queue:" in k])


def test_an_item_over_max_item_bytes_arrives_as_its_size():
    """The head over max_item_bytes stays in Redis: the script's reply is its length."""
    recording = wire.load("orchestrata")
    huge = next(
        rnd
        for rnd in recording["rounds"]
        if any("orchestrata:queue:huge:p0" in map(str, command) for command in rnd["commands"])
    )
    sizes = [part for part in huge["replies"][-1] if isinstance(part, int)]
    assert len(sizes) == 1 and sizes[0] > 1024


def test_enumerated_queues_read_zero_when_their_keys_are_absent():
    """RQ's queues come from the rq:queues set (values.py): "low" has no keys at all, and
    reads 0 in every state but the one whose key holds another type."""
    cycle = wire.replay(SCENARIOS["rq"], wire.load("rq"))
    low = {
        labels[3]: value
        for labels, value in cycle.samples.table(DEPTH).items()
        if labels[1] == "low"
    }
    assert low == {"pending": 0, "active": 0, "scheduled": 0, "failed": 0}


def test_a_read_built_otherwise_than_recorded_fails_naming_its_round():
    scenario = SCENARIOS["runnerq"]
    recording = copy.deepcopy(wire.load("runnerq"))
    recording["rounds"][1]["commands"][0][2] = "0"  # a bound the sampler does not send
    with pytest.raises(AssertionError, match="round 1 differs from the recording"):
        wire.replay(scenario, recording)


def test_a_recording_with_rounds_left_over_fails():
    scenario = SCENARIOS["orchestrata"]
    recording = copy.deepcopy(wire.load("orchestrata"))
    recording["rounds"].append(recording["rounds"][0])
    with pytest.raises(AssertionError, match="rounds recorded but not sent"):
        wire.replay(scenario, recording)
