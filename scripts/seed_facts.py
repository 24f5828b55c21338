"""The seed documents' facts the tests use, checked against the documents themselves.

The documents that describe the in-house systems (Attune's `queue_stats` migration, Orchestrata's
QueueManager source, Runner-Q's layouts) live outside the repository, in `shared/` beside the
clone; the facts the tests take from them live inside it, in tests/seed_facts.json, so a clone
with nothing beside it runs the whole suite. This script extracts the facts from the documents
again and compares them with that file, so the two cannot drift:

    python3 scripts/seed_facts.py            # compare (.ci/run's seed-facts step)
    python3 scripts/seed_facts.py --write    # rewrite tests/seed_facts.json from the documents

It looks for `shared/` beside the clone (or above a worktree's folder), or $QE_SHARED_DIR; with
none there it says so and exits 0: the facts file is then the only copy, as in any user's clone.
Only the standard library: it runs before any venv exists.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FACTS = ROOT / "tests" / "seed_facts.json"
ATTUNE = "seeds/000_befa715643ccf7c2.txt"
ORCHESTRATA = "seeds/002_ac9fb5960240179a.txt"
RUNNERQ = "seeds/003_8fe179a07db48b64.txt"
LAYOUTS = "reference/queue-layouts.md"


def shared_dir() -> Path | None:
    """`shared/` beside the clone (or above a worktree's folder), or $QE_SHARED_DIR."""
    candidates = [ROOT.parent / "shared", ROOT.parent.parent / "shared"]
    if os.environ.get("QE_SHARED_DIR"):
        candidates.insert(0, Path(os.environ["QE_SHARED_DIR"]))
    for candidate in candidates:
        if (candidate / "seeds" / "README.md").is_file():
            return candidate
    return None


class Documents:
    """The seed documents and reference of one `shared/` folder, read once each."""

    def __init__(self, shared: Path) -> None:
        self.shared = shared
        self._texts: dict[str, str] = {}

    def text(self, name: str) -> str:
        if name not in self._texts:
            self._texts[name] = (self.shared / name).read_text()
        return self._texts[name]

    def one(self, pattern: str, document: str) -> re.Match[str]:
        match = re.search(pattern, self.text(document), flags=re.S)
        if match is None:
            raise SystemExit(f"seed facts: {document} no longer holds {pattern!r}")
        return match

    def section(self, heading: str, next_heading: str) -> str:
        return self.one(rf"## {heading}.*?(?=\n## {next_heading})", LAYOUTS).group(0)


def _table_types(section: str) -> dict[str, str]:
    """Key template -> Redis type, from a reference table's first two columns."""
    return dict(re.findall(r"^\| `([^`]+)` \| (\w+)", section, flags=re.M))


def attune(documents: Documents) -> dict[str, Any]:
    ddl = documents.one(r"CREATE TABLE attune\.queue_stats \(.*?\n\);", ATTUNE).group(0)
    body = ddl.split("(", 1)[1]
    statuses = documents.one(r"execution_status_enum` with values ([a-z, ]+)", LAYOUTS).group(1)
    return {
        "queue_stats_ddl": ddl.splitlines(),
        "queue_stats_columns": re.findall(r"^\s+(\w+) [A-Z]", body, flags=re.M),
        "execution_statuses": [status.strip() for status in statuses.split(",")],
    }


def orchestrata(documents: Documents) -> dict[str, Any]:
    source = documents.text(ORCHESTRATA)
    builders = re.findall(r'def (_\w+_key)\(self.*?return f"(orchestrata:[^"]+)"', source, re.S)
    if not builders:
        raise SystemExit(f"seed facts: {ORCHESTRATA} no longer holds QueueManager's key builders")

    def dict_keys(variable: str) -> list[str]:
        body = documents.one(rf"{variable} = \{{(.*?)\n\s*\}}", ORCHESTRATA).group(1)
        return re.findall(r'^\s*"(\w+)":', body, flags=re.M)

    fields = {name: dict_keys(name) for name in ("message_data", "dlq_entry", "metadata")}
    # The single HSETs of dequeue and the dead-letter move, beside the enqueue mapping.
    singles = re.findall(r'client\.hset\(\s*meta_key, "(\w+)"', source)
    section = documents.section(r"1\. Orchestrata", r"2\.")
    return {
        "key_templates": dict(builders),
        "fields": fields,
        "metadata_fields": sorted({*fields["metadata"], *singles}),
        # The reference writes the key builders' holes <recipient>; the seed's f-strings {recipient}.
        "key_types": {
            re.sub(r"<(\w+)>", r"{\1}", key): kind for key, kind in _table_types(section).items()
        },
    }


def runnerq(documents: Documents) -> dict[str, Any]:
    section = documents.section(r"2\. Runner-Q", r"3\.")

    def listed(pattern: str, what: str) -> str:
        found = re.search(pattern, section)
        if found is None:
            raise SystemExit(f"seed facts: {LAYOUTS} no longer states Runner-Q's {what}")
        return found.group(1)

    weights = listed(r"\*\*priority = floor\(score / 1e6\)\*\*: ([A-Za-z0-9, ]+)", "priorities")
    hash_row = listed(r"(?m)^\| `activity:\{uuid\}` \|[^|]*\|(.*)\|$", "activity hash")
    statuses = documents.one(r"Status values: ([A-Za-z, ]+)\.", LAYOUTS).group(1)
    return {
        "key_types": _table_types(section),
        "priority_weights": {
            name: int(weight) for name, weight in (pair.split() for pair in weights.split(","))
        },
        "activity_fields": [
            field.strip() for field in listed(r'"activity": \{([a-z_, ]+)\}', "fields").split(",")
        ],
        "hash_fields": re.findall(r"`(\w+)`", hash_row),
        "event_types": listed(r'"event_type": "([A-Za-z|]+)"', "event types").split("|"),
        "statuses": [status.strip() for status in statuses.split(",")],
    }


def extract(shared: Path) -> dict[str, Any]:
    documents = Documents(shared)
    return {
        "_about": (
            "Facts the tests take from the seed documents (seeds 000, 002, 003 and the "
            "reference's queue-layouts.md), written by scripts/seed_facts.py --write, which "
            "without --write compares them with the documents."
        ),
        "attune": attune(documents),
        "orchestrata": orchestrata(documents),
        "runnerq": runnerq(documents),
    }


def differences(kept: Any, found: Any, where: str = "") -> list[str]:
    """Each place where the kept facts and the documents' differ, by its path in the JSON."""
    if isinstance(kept, dict) and isinstance(found, dict):
        return [
            line
            for key in sorted({*kept, *found})
            for line in differences(kept.get(key), found.get(key), f"{where}.{key}")
        ]
    return [] if kept == found else [f"{where}: kept {kept!r}, documents say {found!r}"]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the facts file")
    args = parser.parse_args(argv)
    shared = shared_dir()
    if shared is None:
        print("seed facts: no shared/seeds/ beside the clone; tests/seed_facts.json stands alone")
        return 0
    found = extract(shared)
    if args.write:
        FACTS.write_text(json.dumps(found, indent=2, ensure_ascii=False) + "\n")
        print(f"seed facts: wrote {FACTS.relative_to(ROOT)} from the documents")
        return 0
    diff = differences(json.loads(FACTS.read_text()), found)
    for line in diff:
        print(f"seed facts: {line}")
    if diff:
        print("seed facts: tests/seed_facts.json and the documents differ (--write rewrites it)")
        return 1
    print("seed facts: tests/seed_facts.json matches the seed documents")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
