"""The seed documents, read by the tests as the truth about the in-house queue systems.

The documents the Orchestrata, Runner-Q and Attune layouts come from live outside this
repository, in `shared/` beside the clone (CI has its copy there, read-only):
- `shared/seeds/000_befa715643ccf7c2.txt`: Attune's `attune.queue_stats` migration (its DDL);
- `shared/seeds/002_ac9fb5960240179a.txt`: Orchestrata's QueueManager source (its key builders
  and the JSON it pushes);
- `shared/seeds/003_8fe179a07db48b64.txt`: Runner-Q's metric families; its key layouts, read
  from its public code, in `shared/reference/queue-layouts.md` section 2 (the seeds' README
  points there).
What the tests write and expect for these systems is taken from these texts (the DDL executed
as written, key shapes and JSON fields extracted), never from exporter/demo/, so a reader and
a writer of this project cannot agree on a wrong layout unnoticed.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ATTUNE = "seeds/000_befa715643ccf7c2.txt"
ORCHESTRATA = "seeds/002_ac9fb5960240179a.txt"
RUNNERQ = "seeds/003_8fe179a07db48b64.txt"
LAYOUTS = "reference/queue-layouts.md"


@functools.cache
def shared_dir() -> Path:
    """`shared/` beside the clone (or above a worktree's folder), or $QE_SHARED_DIR."""
    candidates = [ROOT.parent / "shared", ROOT.parent.parent / "shared"]
    if os.environ.get("QE_SHARED_DIR"):
        candidates.insert(0, Path(os.environ["QE_SHARED_DIR"]))
    for candidate in candidates:
        if (candidate / "seeds" / "README.md").is_file():
            return candidate
    tried = ", ".join(str(candidate) for candidate in candidates)
    raise FileNotFoundError(
        f"the seed documents (shared/seeds/) are not beside the clone (tried {tried}): CI "
        "copies shared/ there; elsewhere set QE_SHARED_DIR to a copy of it"
    )


@functools.cache
def text(name: str) -> str:
    return (shared_dir() / name).read_text()


def _one(pattern: str, document: str) -> re.Match[str]:
    match = re.search(pattern, text(document), flags=re.S)
    if match is None:
        raise AssertionError(f"{document} no longer holds {pattern!r}")
    return match


# -- Attune (seed 000) ----------------------------------------------------------------------------


def attune_queue_stats_ddl(schema: str = "attune") -> str:
    """The seed's `CREATE TABLE attune.queue_stats (...)`, verbatim but for the schema name."""
    statement = _one(r"CREATE TABLE attune\.queue_stats \(.*?\n\);", ATTUNE).group(0)
    return statement.replace("attune.queue_stats", f"{schema}.queue_stats", 1)


def attune_queue_stats_columns() -> list[str]:
    """The queue_stats columns in the seed's order."""
    body = attune_queue_stats_ddl().split("(", 1)[1]
    return re.findall(r"^\s+(\w+) [A-Z]", body, flags=re.M)


def attune_execution_statuses() -> list[str]:
    """execution_status_enum's values, in the reference's order (queue-layouts.md section 3)."""
    listed = _one(r"execution_status_enum` with values ([a-z, ]+)", LAYOUTS).group(1)
    return [status.strip() for status in listed.split(",")]


# -- Orchestrata (seed 002) -----------------------------------------------------------------------


def orchestrata_key_templates() -> dict[str, str]:
    """QueueManager's key builders, e.g. {"_queue_key": "orchestrata:queue:{recipient}:p{priority}"}."""
    found = re.findall(
        r'def (_\w+_key)\(self.*?return f"(orchestrata:[^"]+)"', text(ORCHESTRATA), re.S
    )
    if not found:
        raise AssertionError(f"{ORCHESTRATA} no longer holds QueueManager's key builders")
    return dict(found)


def orchestrata_fields(variable: str) -> list[str]:
    """The keys of the dict literal the seed assigns to `variable` (message_data, dlq_entry,
    metadata), in its order."""
    body = _one(rf"{variable} = \{{(.*?)\n\s*\}}", ORCHESTRATA).group(1)
    return re.findall(r'^\s*"(\w+)":', body, flags=re.M)


def orchestrata_metadata_fields() -> set[str]:
    """Every field the seed writes into a msg_meta hash (the enqueue mapping and the single
    HSETs of dequeue and the dead-letter move)."""
    singles = re.findall(r'client\.hset\(\s*meta_key, "(\w+)"', text(ORCHESTRATA))
    return {*orchestrata_fields("metadata"), *singles}


# -- Runner-Q (queue-layouts.md section 2, the seed 003 system) ----------------------------------


def _runnerq_section() -> str:
    return _one(r"## 2\. Runner-Q.*?(?=\n## 3\.)", LAYOUTS).group(0)


def runnerq_key_templates() -> list[str]:
    """The key column of the reference's table, e.g. `{q}:priority_queue`, `activity:{uuid}`."""
    return re.findall(r"^\| `([^`]+)` \|", _runnerq_section(), flags=re.M)


def runnerq_priority_weights() -> dict[str, int]:
    """Priority name -> floor(score / 1e6), as the reference states it ("Low 1, Normal 2...")."""
    listed = re.search(
        r"\*\*priority = floor\(score / 1e6\)\*\*: ([A-Za-z0-9, ]+)", _runnerq_section()
    )
    if listed is None:
        raise AssertionError(f"{LAYOUTS} no longer states Runner-Q's priority weights")
    pairs = (item.split() for item in listed.group(1).split(","))
    return {name: int(weight) for name, weight in pairs}


def runnerq_activity_fields() -> list[str]:
    """The fields of an activity's JSON, as the dead-letter entry's `activity` lists them."""
    listed = re.search(r'"activity": \{([a-z_, ]+)\}', _runnerq_section())
    if listed is None:
        raise AssertionError(f"{LAYOUTS} no longer lists Runner-Q's activity fields")
    return [field.strip() for field in listed.group(1).split(",")]


def runnerq_hash_fields() -> list[str]:
    """The activity:{uuid} hash fields the reference names."""
    row = re.search(r"^\| `activity:\{uuid\}` \|[^|]*\|(.*)\|$", _runnerq_section(), flags=re.M)
    if row is None:
        raise AssertionError(f"{LAYOUTS} no longer describes Runner-Q's activity hash")
    return re.findall(r"`(\w+)`", row.group(1))


def runnerq_event_types() -> list[str]:
    listed = re.search(r'"event_type": "([A-Za-z|]+)"', _runnerq_section())
    if listed is None:
        raise AssertionError(f"{LAYOUTS} no longer lists Runner-Q's event types")
    return listed.group(1).split("|")


def shape(template: str) -> re.Pattern[str]:
    """A key template ({name} holes) as a pattern: a hole is any text without a colon, but the
    last one, which may hold colons (an idempotency key, a recipient is free text)."""
    parts = re.split(r"\{\w+\}", template)
    holes = ["[^:]+"] * (len(parts) - 2) + [".+"] if len(parts) > 1 else []
    pattern = "".join(
        re.escape(part) + hole for part, hole in zip(parts, [*holes, ""], strict=True)
    )
    return re.compile(pattern)


def _table_types(section: str) -> dict[str, str]:
    """Key template -> Redis type, from a reference table's first two columns."""
    rows = re.findall(r"^\| `([^`]+)` \| (\w+)", section, flags=re.M)
    return dict(rows)


def runnerq_key_types() -> dict[str, str]:
    return _table_types(_runnerq_section())


def orchestrata_key_types() -> dict[str, str]:
    """Orchestrata's keys and types as the reference tabulates them from seed 002 (its key
    builders' `<recipient>` holes written `{recipient}` as the seed's f-strings do)."""
    section = _one(r"## 1\. Orchestrata.*?(?=\n## 2\.)", LAYOUTS).group(0)
    return {re.sub(r"<(\w+)>", r"{\1}", key): kind for key, kind in _table_types(section).items()}


def runnerq_statuses() -> list[str]:
    listed = _one(r"Status values: ([A-Za-z, ]+)\.", LAYOUTS).group(1)
    return [status.strip() for status in listed.split(",")]
