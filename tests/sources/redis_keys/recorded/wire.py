"""One key-sampler cycle over a scenario's keys, its replies from a real Redis or a recording.

The cycle is the sampler's own code: the configuration's key groups (presets expanded), the
reads commands.py builds for each key (in bulk, per key, follow-ups), the rounds rounds.py
makes of them and sorts the replies of, values.py's values of a group whose keys are built from
a set. Only the wire is swapped, in one place: rounds.py's SentCommands (one round trip) is a
Recorder's, which sends the round to Redis and keeps commands and replies, or a Replay's,
which checks the round is the one recorded and hands back its replies.

What a SCAN would find is the scenario's keys in order (SCAN's own order differs between
servers); the values a set names are read with SMEMBERS. The sampler's SCAN and SSCAN paths are
tested against a real Redis elsewhere (test_key_scans.py, test_key_group_members.py).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from exporter.config import settings as config_module
from exporter.core.logs import LogLimiter
from exporter.redis import pipeline
from exporter.sources.redis_keys import rounds
from exporter.sources.redis_keys.commands import Cycle, GroupReads, Learned
from exporter.sources.redis_keys.groups import key_regex
from exporter.sources.redis_keys.types import FoundKey, GroupTally, key_match
from exporter.sources.redis_keys.values import built_keys, member_values, select
from tests.sources.redis_keys.recorded.scenarios import NOW, Scenario

HERE = Path(__file__).resolve().parent
RECORD_COMMAND = "python -m tests.sources.redis_keys.recorded.record"
log = logging.getLogger(__name__)


def recording_path(name: str) -> Path:
    return HERE / f"{name}.json"


# -- commands and replies as JSON ------------------------------------------------------------


def encode(value: Any) -> Any:
    """A command's argument or a reply as JSON: text as a string, other bytes as {"base64"},
    an error reply as {"error"}, a script as {"script": its sha1} (its text is in the code)."""
    if isinstance(value, redis.ResponseError):
        return {"error": str(value)}
    if isinstance(value, (list, tuple)):
        return [encode(part) for part in value]
    if isinstance(value, str) and value.startswith("#!lua"):
        return {"script": hashlib.sha1(value.encode()).hexdigest()}
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, float):  # as the wire carries it: Redis reads the text
        return repr(value)
    return value  # str, int, None


def decode(reply: Any) -> Any:
    """A reply from its JSON, as hiredis gives it (bytes, int, None, list, ResponseError)."""
    if isinstance(reply, str):
        return reply.encode()
    if isinstance(reply, list):
        return [decode(part) for part in reply]
    if isinstance(reply, dict):
        if "error" in reply:
            return redis.ResponseError(reply["error"])
        return base64.b64decode(reply["base64"])
    return reply


# -- the wire: to Redis and recorded, or replayed ------------------------------------------------


class Recorder:
    """Each round sent to a real Redis (the project's SentCommands), its commands and replies
    kept in order."""

    def __init__(self) -> None:
        self.rounds: list[dict[str, Any]] = []

    def __call__(self, client: redis.Redis, commands: list[Any]) -> _Recorded:
        return _Recorded(self, client, commands)


class _Recorded:
    def __init__(self, recorder: Recorder, client: redis.Redis, commands: list[Any]) -> None:
        self._recorder, self._commands = recorder, commands
        self._sent = pipeline.SentCommands(client, commands)

    def replies(self) -> list[Any]:
        replies = [
            _set_in_order(command, reply)
            for command, reply in zip(self._commands, self._sent.replies(), strict=True)
        ]
        self._recorder.rounds.append(
            {"commands": encode(self._commands), "replies": encode(replies)}
        )
        return replies

    def abandon(self) -> None:
        self._sent.abandon()


def _set_in_order(command: Any, reply: Any) -> Any:
    """SMEMBERS's members sorted: a set's order is the server's (Redis 7.0 hashes them with a
    seed drawn at each start), so a recording made on one server would differ on the next. The
    sampler is handed the sorted reply too, as any server might have answered."""
    name = command[0] if isinstance(command, (list, tuple)) and command else None
    if isinstance(name, bytes):
        name = name.decode()
    if isinstance(name, str) and name.upper() == "SMEMBERS" and isinstance(reply, list):
        return sorted(reply)
    return reply


class Replay:
    """The recorded rounds in order: each round the cycle sends must be the one recorded (the
    same commands, arguments and order), and gets the replies Redis gave it."""

    def __init__(self, recorded: list[dict[str, Any]]) -> None:
        self._rounds = iter(enumerate(recorded))

    def __call__(self, client: None, commands: list[Any]) -> _Replayed:
        at, recorded = next(self._rounds, (None, None))
        sent = encode(commands)
        if recorded is None:
            raise AssertionError(f"a round beyond the recording: {sent!r:.300}")
        if sent != recorded["commands"]:
            raise AssertionError(
                f"round {at} differs from the recording (the reads are built otherwise now; if "
                f"that is meant, record again: {RECORD_COMMAND}):\n"
                f"  sent:     {sent!r:.2000}\n  recorded: {recorded['commands']!r:.2000}"
            )
        return _Replayed(decode(recorded["replies"]))

    def unused(self) -> int:
        return sum(1 for _ in self._rounds)


class _Replayed:
    def __init__(self, replies: list[Any]) -> None:
        self._replies = replies

    def replies(self) -> list[Any]:
        return self._replies

    def abandon(self) -> None:
        pass


@contextlib.contextmanager
def wire(sent_commands: Any) -> Iterator[None]:
    """rounds.py's round trips go through `sent_commands` (a Recorder or a Replay) for the block."""
    real = rounds.SentCommands
    rounds.SentCommands = sent_commands
    try:
        yield
    finally:
        rounds.SentCommands = real


# -- one cycle ------------------------------------------------------------------------------------


def sample(scenario: Scenario, client: redis.Redis | None) -> Cycle:
    """One cycle over the scenario's keys, through whatever wire() is in force; `client` is
    Redis's (recording) or None (replaying: the wire never touches it)."""
    config = config_module.from_dict(scenario.config).sources.redis
    assert not isinstance(config, list) and config is not None
    tallies = [GroupTally(group, "redis", LogLimiter(log)) for group in config.key_groups]
    cycle = Cycle(NOW, tallies, config.max_item_bytes, None, Learned())
    transport = rounds.Transport(cycle, client, None, config.pipeline_size)
    for tally in tallies:
        if tally.group.enumerated:
            pages = _built_pages(cycle, transport, tally, config.scan_count)
        else:
            pages = [_matched_page(tally, scenario.found_keys())]
        for page in pages:
            if page:
                _read(cycle, transport, tally, page)
    transport.flush()
    cycle.finish()  # as the sampler ends a cycle
    return cycle


def _matched_page(tally: GroupTally, keys: list[bytes]) -> list[FoundKey]:
    """The keys the group's pattern matches, as the sampler's SCAN routes them."""
    regex, group = key_regex(tally.group.pattern), tally.group
    page = []
    for key in keys:
        found = regex.match(key.decode())
        if found:
            page.append((key, key_match(group, found.groupdict())))
    tally.matched(page)
    return page


def _built_pages(
    cycle: Cycle, transport: rounds.Transport, tally: GroupTally, size: int
) -> list[list[FoundKey]]:
    """The keys built from the group's values: each set's members read (SMEMBERS), the values
    they name selected (values.py)."""
    group = tally.group
    choices = {name: list(values) for name, values in group.values.items()}
    for name, members in group.values_from_set.items():
        read: list[bytes] = []
        command = (("SMEMBERS", members.key), read.extend, tally)
        transport.add([command])
        transport.flush()
        choices[name] = sorted(member_values(read, members.member))
    for name, selection in group.select.items():
        choices[name], left_out = select(choices[name], selection)
        tally.left_out(name, left_out)
    pages = built_keys(group, choices, size, None).pages
    for page in pages:
        tally.built(page)
    return pages


def _read(
    cycle: Cycle, transport: rounds.Transport, tally: GroupTally, page: list[FoundKey]
) -> None:
    """A page's reads, as the sampler queues them: TYPE first for a group of several types,
    in bulk where the group suits it, else each key's commands."""
    group = tally.group
    if len(group.types) > 1:
        transport.add(cycle.typed_reads(tally, page))
    elif GroupReads.suits(group):
        transport.add_run(GroupReads(tally, cycle, group), page)
    else:
        transport.add(cmd for found in page for cmd in cycle.commands_for_key(tally, group, *found))


def record(scenario: Scenario, client: redis.Redis) -> dict[str, Any]:
    """The scenario's keys written into `client`'s database, one cycle read from it: the
    recording (what was sent and answered)."""
    scenario.write(client)
    recorder = Recorder()
    with wire(recorder):
        sample(scenario, client)
    return {
        "about": f"scenario {scenario.name} (tests/sources/redis_keys/recorded/scenarios.py), "
        f"recorded by {RECORD_COMMAND}",
        "now": NOW,
        "rounds": recorder.rounds,
    }


def replay(scenario: Scenario, recording: dict[str, Any]) -> Cycle:
    """One cycle over the scenario's keys, each round answered from the recording."""
    assert recording["now"] == NOW, "recorded at another NOW: record again"
    replayed = Replay(recording["rounds"])
    with wire(replayed):
        cycle = sample(scenario, None)
    assert replayed.unused() == 0, f"rounds recorded but not sent: record again ({RECORD_COMMAND})"
    return cycle


def load(name: str) -> dict[str, Any]:
    recording: dict[str, Any] = json.loads(recording_path(name).read_text())
    return recording
