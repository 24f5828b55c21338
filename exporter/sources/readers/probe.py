"""`check-config --connect` for native readers: each reader's Redis holds some record of its
system, and each command the reader will send runs under the configured user.

A reader none of whose record globs matches is a warning (its system has not run against this
database). Each command is tried in a harmless form (redis/acl.py COMMAND_TRIALS): one refused
is named with what the ACL (or the server) needs, a failure, or a warning when it costs one
figure only (BullMQ's and Bull's CLIENT LIST: their worker count). A reader whose record says
more when run a while (Celery: its workers) has a `watch` in its registry record.
"""

from __future__ import annotations

import redis

from exporter.core.printable import printable
from exporter.redis.acl import COMMAND_TRIALS, key_of, refusal_needs
from exporter.redis.connection import RedisConnectionConfig, redis_error_reason
from exporter.sources.probe import Echo, Findings, ProbeContext, first_line, text
from exporter.sources.readers.config import ReaderConfig
from exporter.sources.readers.registry import READERS

# SCAN calls a native reader's record check makes at most (COUNT 1000 each): a database too
# large to find a record in that many is not called empty.
RECORD_SCANS = 100


def probe(
    readers: dict[str, ReaderConfig], default: RedisConnectionConfig, context: ProbeContext
) -> Findings:
    """Each enabled reader (by its section's name) on its Redis (`default`: sources.redis's)."""
    findings = Findings()
    echo, unreachable = context.echo, context.unreachable
    for name, reader in readers.items():
        connection = reader.redis or default
        target = connection.masked_url()
        if target in unreachable | findings.unreachable:  # named FAILED above
            continue
        globs = reader.record_globs()
        try:
            found = _any_key(connection, globs)
        except redis.RedisError as error:
            reason = f"{redis_error_reason(error)}: {first_line(error)}"
            echo(f"native {name} at {target}: FAILED ({reason})")
            findings.add(Findings(failures=[f"redis at {target}"], unreachable={target}))
            continue
        findings.add(_reader_commands(name, reader, connection, echo))
        watch = READERS[name].watch
        if watch is not None:
            findings.add(watch(reader, connection, context))
        if found is None:
            echo(f"native {name} at {target}: a record found is not checked (a cluster)")
        elif found:
            echo(f"native {name} at {target}: records found ({printable(found)})")
        else:
            echo(f"native {name} at {target}: no record of {reader.system} found")
            findings.warnings.append(
                f"native reader {name} at {target}: nothing to read, no key matches "
                f"{', '.join(printable(glob) for glob in globs)}: {name} has not run against "
                "this database (the wrong database number?) or its records are elsewhere"
            )
    return findings


def _reader_commands(
    name: str, reader: ReaderConfig, connection: RedisConnectionConfig, echo: Echo
) -> Findings:
    """Each command the reader will send, tried under the configured user; the refused ones
    named with what they need: a failure, or a warning for one that costs one figure only."""
    findings = Findings()
    if connection.is_cluster:
        return findings
    target = connection.masked_url()
    globs = [glob for glob in reader.acl_read_keys() if key_of(glob) is not None]
    glob = globs[0] if globs else "*"
    channel = next(iter(reader.acl_channels(connection)), "")
    trials = [(command, glob) for command in reader.commands_sent()]
    trials += [(command, value_glob) for command, value_glob in reader.acl_value_reads()]
    client = connection.connect()
    try:
        for command, key_glob in trials:
            error = _refusal(client, command, key_of(key_glob) or "", channel, reader)
            if error is None:
                continue
            needs = refusal_needs(command, error, key_glob, channel)
            figure = reader.ONE_FIGURE.get(command)
            cost = f"{figure} is not served" if figure else "every read fails"
            line = f"{command.upper().replace('|', ' ')} refused ({first_line(error)}): {needs}"
            echo(f"native {name} at {target}: {line}; {cost}")
            said = f"native reader {name} at {target}: {line}; {cost}"
            (findings.warnings if figure else findings.failures).append(said)
    finally:
        client.close()
    return findings


def _refusal(
    client: redis.Redis, command: str, key: str, channel: str, reader: ReaderConfig
) -> redis.ResponseError | None:
    """The error refusing one command (NOPERM, an unknown command), None when it runs (an
    error about the key, as WRONGTYPE or a missing stream, is no refusal)."""
    try:
        if command in ("multi", "exec"):  # around another of the reader's reads
            other = next(c for c in reader.commands_sent() if c in COMMAND_TRIALS)
            pipe = client.pipeline(transaction=True)
            pipe.execute_command(*_filled(COMMAND_TRIALS[other], key))  # type: ignore[no-untyped-call]
            pipe.execute(raise_on_error=False)
        elif command == "psubscribe":
            pubsub = client.pubsub()  # type: ignore[no-untyped-call]
            try:
                pubsub.psubscribe(channel)
                pubsub.get_message(timeout=1.0)  # the refusal comes as the reply
            finally:
                pubsub.close()
        elif command in COMMAND_TRIALS:
            client.execute_command(*_filled(COMMAND_TRIALS[command], key))  # type: ignore[no-untyped-call]
    except redis.exceptions.NoPermissionError as error:
        return error
    except redis.ResponseError as error:
        text = str(error).lower()
        refused = text.startswith("unknown command") or "unknown subcommand" in text
        return error if refused or "noperm" in text else None
    return None


def _filled(words: tuple[str, ...], key: str) -> list[str]:
    return [key if word == "{key}" else word for word in words]


def _any_key(connection: RedisConnectionConfig, globs: list[str]) -> str | None:
    """A key matching one of the globs ("" when none is, None on a cluster: not checked).
    At most RECORD_SCANS SCANs of COUNT 1000 per glob; a database larger than that with no
    match found counts as found (nothing is claimed that was not seen)."""
    if connection.is_cluster or not globs:
        return None
    client = connection.connect()
    try:
        for glob in globs:
            cursor, scans = 0, 0
            while True:
                cursor, keys = client.scan(cursor, match=glob, count=1000)
                scans += 1
                if keys:
                    return text(keys[0])
                if cursor == 0:
                    break
                if scans >= RECORD_SCANS:
                    return f"not searched past {RECORD_SCANS * 1000} keys"
    finally:
        client.close()
    return ""
