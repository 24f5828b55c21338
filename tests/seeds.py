"""The seed documents' facts, read by the tests as the truth about the in-house queue systems.

The documents the Orchestrata, Runner-Q and Attune layouts come from live outside this
repository (the seeds and the layouts reference, beside CI's clone); the
facts the tests take from them are kept here, in tests/seed_facts.json, extracted from the
documents by scripts/seed_facts.py, which also checks that the two still agree wherever the
documents are present (its own step of .ci/run). From them:
- Attune: the `attune.queue_stats` DDL of seed 000 (its migration), executed as written; the
  `execution_status_enum` values of queue-layouts.md section 3;
- Orchestrata: QueueManager's key builders and the fields of the JSON and hashes it writes
  (seed 002), and the key types the reference tabulates from it (section 1);
- Runner-Q: its key layouts, priority weights, activity fields, event types and statuses
  (queue-layouts.md section 2, the seed 003 system).
What the tests write and expect for these systems comes from these facts, never from
exporter/demo/, so a reader and a writer of this project cannot agree on a wrong layout unnoticed.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

FACTS = Path(__file__).resolve().parent / "seed_facts.json"


@functools.cache
def _facts() -> dict[str, Any]:
    facts: dict[str, Any] = json.loads(FACTS.read_text())
    return facts


# -- Attune (seed 000) ----------------------------------------------------------------------------


def attune_queue_stats_ddl(schema: str = "attune") -> str:
    """The seed's `CREATE TABLE attune.queue_stats (...)`, verbatim but for the schema name."""
    statement = "\n".join(_facts()["attune"]["queue_stats_ddl"])
    return statement.replace("attune.queue_stats", f"{schema}.queue_stats", 1)


def attune_queue_stats_columns() -> list[str]:
    """The queue_stats columns in the seed's order."""
    return list(_facts()["attune"]["queue_stats_columns"])


def attune_execution_statuses() -> list[str]:
    """execution_status_enum's values, in the reference's order (queue-layouts.md section 3)."""
    return list(_facts()["attune"]["execution_statuses"])


# -- Orchestrata (seed 002) -----------------------------------------------------------------------


def orchestrata_key_templates() -> dict[str, str]:
    """QueueManager's key builders, e.g. {"_queue_key": "orchestrata:queue:{recipient}:p{priority}"}."""
    return dict(_facts()["orchestrata"]["key_templates"])


def orchestrata_fields(variable: str) -> list[str]:
    """The keys of the dict literal the seed assigns to `variable` (message_data, dlq_entry,
    metadata), in its order."""
    return list(_facts()["orchestrata"]["fields"][variable])


def orchestrata_metadata_fields() -> set[str]:
    """Every field the seed writes into a msg_meta hash (the enqueue mapping and the single
    HSETs of dequeue and the dead-letter move)."""
    return set(_facts()["orchestrata"]["metadata_fields"])


def orchestrata_key_types() -> dict[str, str]:
    """Orchestrata's keys and types as the reference tabulates them from seed 002 (its key
    builders' holes written `{recipient}` as the seed's f-strings do)."""
    return dict(_facts()["orchestrata"]["key_types"])


# -- Runner-Q (queue-layouts.md section 2, the seed 003 system) ----------------------------------


def runnerq_key_types() -> dict[str, str]:
    """Key template -> Redis type, e.g. {"{q}:priority_queue": "zset", ...}."""
    return dict(_facts()["runnerq"]["key_types"])


def runnerq_priority_weights() -> dict[str, int]:
    """Priority name -> floor(score / 1e6), as the reference states it ("Low 1, Normal 2...")."""
    return dict(_facts()["runnerq"]["priority_weights"])


def runnerq_activity_fields() -> list[str]:
    """The fields of an activity's JSON, as the dead-letter entry's `activity` lists them."""
    return list(_facts()["runnerq"]["activity_fields"])


def runnerq_hash_fields() -> list[str]:
    """The activity:{uuid} hash fields the reference names."""
    return list(_facts()["runnerq"]["hash_fields"])


def runnerq_event_types() -> list[str]:
    return list(_facts()["runnerq"]["event_types"])


def runnerq_statuses() -> list[str]:
    return list(_facts()["runnerq"]["statuses"])


def shape(template: str) -> re.Pattern[str]:
    """A key template ({name} holes) as a pattern: a hole is any text without a colon, but the
    last one, which may hold colons (an idempotency key, a recipient is free text)."""
    parts = re.split(r"\{\w+\}", template)
    holes = ["[^:]+"] * (len(parts) - 2) + [".+"] if len(parts) > 1 else []
    pattern = "".join(
        re.escape(part) + hole for part, hole in zip(parts, [*holes, ""], strict=True)
    )
    return re.compile(pattern)
