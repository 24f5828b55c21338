"""`check-config --connect` for SQL collectors: one query each, as serve runs it, with its rows
and the series they give. A server that refuses the connection is one failure, named once.
"""

from __future__ import annotations

import psycopg

from exporter.output.samples import SampleSet
from exporter.sources.postgres import source as postgres
from exporter.sources.postgres.config import PostgresSourceConfig
from exporter.sources.probe import Findings, ProbeContext, first_line
from exporter.sources.source import DeadlineExceeded, sample_within_deadline


def probe(postgres_config: PostgresSourceConfig, context: ProbeContext) -> Findings:
    """The server once, then each collector. A server that refuses is in `unreachable`, so
    the finished-rows readers' probe (readers/finished_rows_probe.py) does not try it again."""
    echo = context.echo
    target = postgres_config.masked_dsn() or f"DSN from {postgres_config.dsn_file}"
    refused = _postgres_refusal(postgres_config)
    if refused is not None:  # one line, within connect_timeout: not a pool retrying per collector
        echo(f"postgres at {target}: FAILED ({refused})")
        return Findings(failures=[f"postgres at {target}"], unreachable={target})
    echo(f"postgres at {target}:")
    failures = []
    sources = postgres.build_sources(postgres_config, context.sample_interval)
    try:
        for source in sources:
            try:
                report = sample_within_deadline(source)
            except Exception as error:
                reason = (
                    "timeout"
                    if isinstance(error, DeadlineExceeded)
                    else postgres.error_reason(error)
                )
                echo(f"  {source.name}: FAILED ({reason}: {first_line(error)})")
                failures.append(source.name)
                continue
            reads = f"; {source.reads}" if source.reads else ""
            echo(
                f"  {source.name}: {source.last_rows} row(s); {_series_summary(report.samples)}{reads}"
            )
    finally:
        for source in sources:
            source.close()
    return Findings(failures=failures)


def _postgres_refusal(config: PostgresSourceConfig) -> str | None:
    """Why one connection, as the collectors' pool would open it, cannot be made (None when
    it can): libpq's connect_timeout bounds it."""
    try:
        with psycopg.connect(config.conninfo(), **config.connect_kwargs()):
            return None
    except psycopg.Error as error:
        reason = "auth" if postgres.is_auth_failure(error) else "connection"
        return f"{reason}: {first_line(error)}"


def _series_summary(samples: SampleSet) -> str:
    parts = [f"{spec.name} {len(series)}" for spec, series in samples.metrics()]
    return f"series: {', '.join(parts)}" if parts else "no rows, no series"
