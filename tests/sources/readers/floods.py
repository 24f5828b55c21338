"""What the readers' flood tests share: the bytes Redis sent, and reads until one counts nothing."""

from __future__ import annotations

from collections.abc import Callable

import redis

from exporter.sources.readers.framework import Signals


def output_bytes(client: redis.Redis) -> int:
    """All Redis has sent to its clients so far (INFO stats)."""
    return int(client.info("stats")["total_net_output_bytes"])


def drain(
    read: Callable[[], Signals], counted: Callable[[Signals], float], admin: redis.Redis, reads: int
) -> tuple[list[float], list[int], dict[str, int]]:
    """Reads until one counts nothing (at most `reads`): what each counted, the bytes the
    server sent for each, and what they refused."""
    counts: list[float] = []
    sent: list[int] = []
    refused: dict[str, int] = {}
    for _ in range(reads):
        before = output_bytes(admin)
        signals = read()
        sent.append(output_bytes(admin) - before)
        counts.append(counted(signals))
        for reason, count in signals.tally.invalid.items():
            refused[reason] = refused.get(reason, 0) + count
        if not counts[-1]:
            break
    return counts, sent, refused
