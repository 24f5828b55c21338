"""The keys one key-sampler cycle reads are bounded by the source's max_keys, shared by its key
groups: queues discovered beyond a group's share are not read (nor built: no memory for them),
and counted and named once a cycle (reason too_many_keys); the queues within it read exactly.
bench/discovered_queues.py measures what 100,000 queues of each system cost (docs/security.md).
"""

from __future__ import annotations

from tests.conftest import scrape_series, total, wait_for

QUEUES = 300
MAX_KEYS = 400  # two groups that found 300 keys each: 200 keys each


def test_queues_beyond_max_keys_are_counted_not_read(redis_client, redis_url, run_exporter):
    pipe = redis_client.pipeline(transaction=False)
    for n in range(QUEUES):
        pipe.sadd("known", f"q{n:03}")  # a set naming the queues: keys built from it
        pipe.rpush(f"built:q{n:03}", "a", "b")
        pipe.rpush(f"scanned:q{n:03}", "a")  # keys found by SCAN
    pipe.execute()
    groups = [
        {
            "system": "built",
            "pattern": "built:{queue}",
            "type": "list",
            "state": "pending",
            "values_from_set": {"queue": {"key": "known"}},
        },
        {"system": "scanned", "pattern": "scanned:{queue}", "type": "list", "state": "pending"},
    ]
    redis = {"url": redis_url, "key_groups": groups, "max_keys": MAX_KEYS}
    app = run_exporter({"sources": {"redis": redis}})

    def read() -> dict | None:
        series = scrape_series(app)
        depths = [
            (dict(labels), v) for (name, labels), v in series.items() if name == "queue_depth"
        ]
        return series if depths else None

    series = wait_for(read)
    depths = {
        (labels["system"], labels["queue"]): depth
        for (name, label_set), depth in series.items()
        if name == "queue_depth"
        for labels in [dict(label_set)]
    }
    built = {queue: depth for (system, queue), depth in depths.items() if system == "built"}
    assert built == {f"q{n:03}": 2 for n in range(MAX_KEYS // 2)}  # the first, in order
    scanned = [queue for system, queue in depths if system == "scanned"]
    assert len(scanned) == MAX_KEYS // 2
    assert all(depth == 1 for (system, _), depth in depths.items() if system == "scanned")
    errors = {
        system: total(
            series, "queue_exporter_source_errors_total", reason="too_many_keys", system=system
        )
        for system in ("built", "scanned")
    }
    assert all(count >= 1 for count in errors.values()), errors
    reports = {report.system: report for report in app.health.key_groups()}
    assert reports["built"].errors["too_many_keys"] == QUEUES - MAX_KEYS // 2
    assert reports["scanned"].errors["too_many_keys"] == QUEUES - MAX_KEYS // 2
    assert "max_keys" in (reports["built"].last_warning or "")
