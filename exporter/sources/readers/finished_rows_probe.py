"""`check-config --connect` for the finished-rows readers: each enabled reader's
`unavailable_when` and `baseline`, run as serve's first read runs them.

A reader its `unavailable_when` silences (django-tasks-db without an index on finished_at,
pg-boss 10) is a warning naming why, as the status page names it once serve runs: the
verdict would otherwise be OK while completions and failures are never counted.
"""

from __future__ import annotations

from exporter.sources.postgres.config import PostgresSourceConfig
from exporter.sources.postgres.finished_config import FinishedRowsConfig
from exporter.sources.postgres.source import PostgresConnector, error_reason
from exporter.sources.probe import Findings, ProbeContext, first_line


def probe(config: PostgresSourceConfig, context: ProbeContext) -> Findings:
    """Each enabled reader of `config.finished`, on the collectors' server."""
    findings = Findings()
    readers = [reader for reader in config.finished if reader.enabled]
    if not readers:
        return findings
    connector = PostgresConnector(config)
    connector.acquire()
    try:
        for reader in readers:
            findings.add(_probe_reader(reader, connector, config, context))
    finally:
        connector.release()
    return findings


def _probe_reader(
    reader: FinishedRowsConfig,
    connector: PostgresConnector,
    config: PostgresSourceConfig,
    context: ProbeContext,
) -> Findings:
    name = f"native:{reader.name}"
    timeout = reader.timeout or config.statement_timeout
    try:
        why = None
        if reader.unavailable_when is not None:
            owner = f"{name}: unavailable_when"
            why = connector.fetch_text(reader.unavailable_when, "unavailable", timeout, owner)
        if why is None:
            connector.fetch(reader.baseline, timeout, 1)
    except Exception as error:
        context.echo(f"  {name}: FAILED ({error_reason(error)}: {first_line(error)})")
        return Findings(failures=[name])
    if why is not None:
        context.echo(f"  {name}: silent ({why})")
        return Findings(warnings=[f"{name} counts nothing from {reader.table}: {why}"])
    context.echo(f"  {name}: reads {reader.table} (its baseline answered)")
    return Findings()
