"""The recordings the fast tests replay (recorded/*.json) are what a live Redis answers now: the
recorder run again on the shared Redis reproduces each file byte for byte. When this fails the
sampler sends other reads, or Redis answers otherwise: record again and read the diff."""

from __future__ import annotations

from tests.conftest import REDIS_HOST, REDIS_PORT
from tests.sources.redis_keys.recorded import record, wire


def test_the_recorder_reproduces_every_recording():
    for name, text in record.record_all(REDIS_HOST, REDIS_PORT).items():
        path = wire.recording_path(name)
        assert path.read_text() == text, (
            f"{path.name} is not what Redis answers now: record again ({wire.RECORD_COMMAND})"
        )
