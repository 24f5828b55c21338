"""Record the key sampler's rounds over each scenario from a real Redis, as JSON beside this file.

    python -m tests.sources.redis_keys.recorded.record            # write every recording
    python -m tests.sources.redis_keys.recorded.record --check    # compare, write nothing

Each scenario's keys go into a database of the shared Redis claimed for the run
(tests/claims.py; QE_TEST_REDIS_HOST, QE_TEST_REDIS_PORT), emptied between scenarios and
flushed at the end. After a change in what the sampler sends, record again and read the diff.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import redis

from tests import claims
from tests.sources.redis_keys.recorded import wire
from tests.sources.redis_keys.recorded.scenarios import SCENARIOS


def as_text(recording: dict[str, Any]) -> str:
    """The recording as JSON with a command or a reply a line, for a diff that reads."""

    def lines(values: list[Any]) -> str:
        return ",\n".join(f"    {json.dumps(value, ensure_ascii=False)}" for value in values)

    rounds = ",\n".join(
        f'  {{"commands": [\n{lines(one["commands"])}\n  ],\n'
        f'   "replies": [\n{lines(one["replies"])}\n  ]}}'
        for one in recording["rounds"]
    )
    head = {key: value for key, value in recording.items() if key != "rounds"}
    return json.dumps(head)[:-1] + f', "rounds": [\n{rounds}\n]}}\n'


def record_all(host: str, port: int) -> dict[str, str]:
    """Each scenario's recording, as the text of its file."""
    texts = {}
    with (
        claims.redis_database(host, port) as db,
        redis.Redis(host=host, port=port, db=db) as client,
    ):
        for name, scenario in SCENARIOS.items():
            claims.flush_keeping_claim(client)
            texts[name] = as_text(wire.record(scenario, client))
    return texts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the files, write none")
    arguments = parser.parse_args()
    host = os.environ.get("QE_TEST_REDIS_HOST", "127.0.0.1")
    port = int(os.environ.get("QE_TEST_REDIS_PORT", "6379"))
    stale = []
    for name, text in record_all(host, port).items():
        path = wire.recording_path(name)
        if arguments.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"recorded {path.name}: {len(json.loads(text)['rounds'])} rounds")
    if stale:
        print(f"recordings not current: {', '.join(stale)}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
