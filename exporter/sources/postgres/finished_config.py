"""`sources.postgres.finished`: a reader of rows a PostgreSQL job queue writes as jobs finish.

One mechanism, configured with data by a preset: a `baseline` query gives the current position
(the newest finished row's cursor, e.g. an events table's id), and `query` the rows finished
past a position, oldest first. Light: loaded by the configuration without psycopg.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from exporter.core.models import StrictModel

# What a row says happened, as the query's `outcome` column spells it: a job finished
# (completed, failed, retried) or, where the table records it too, a job enqueued.
OUTCOMES = ("completed", "failed", "retried", "enqueued")
# {after_<name>} in the query: the last row's column cursor_<name>, a tie-breaker of `cursor`.
_TIE = re.compile(r"\{after_(\w+)\}")


class FinishedRowsConfig(StrictModel):
    enabled: bool = Field(True, description="read the rows (off: depth only)")
    name: str = Field(
        min_length=1,
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$",
        description="the source is native:<name>",
    )
    system: str = Field(min_length=1, description="the system label of what it counts")
    table: str = Field(min_length=1, description="the table the rows come from, for messages")
    baseline: str = Field(
        description="one row, column `cursor`: the newest finished row's position now (NULL: "
        "no row yet); a new reader starts there and counts nothing before it"
    )
    query: str = Field(
        description="the rows finished after {after} (the last position counted), at most "
        "{limit}, ordered by cursor; columns cursor, queue, job_type, outcome (completed, "
        "failed, retried; enqueued for a row that records an enqueue) and, may be NULL, "
        "execution_seconds, wait_seconds, error_type. Where "
        "rows can share a cursor, each {after_<name>} is the last row's column cursor_<name> "
        "(NULL after a baseline without it: every row at {after} counted), and the query pages "
        "by (cursor, cursor_<name>...) in that order"
    )
    unavailable_when: str | None = Field(
        None,
        description="a read-only statement run before the reads: a row whose column "
        "`unavailable` is not NULL leaves the reader silent with that text (nothing read, the "
        "reason on the status page, in queue_exporter_native_silent and as a check-config "
        "--connect warning), for a version of the "
        "system whose finished rows cannot be read without a scan; checked at every read while "
        "it says so, and after a failed read",
    )
    interval: float | None = Field(
        None, gt=0, description="seconds between reads (default: the postgres sample_interval)"
    )
    timeout: float | None = Field(
        None, gt=0, description="statement timeout in seconds (default: statement_timeout)"
    )
    max_rows: int = Field(
        10_000, ge=1, description="rows counted per read at most; the rest at the next read"
    )

    @field_validator("query")
    @classmethod
    def _placeholders(cls, query: str) -> str:
        missing = [name for name in ("{after}", "{limit}") if name not in query]
        if missing:
            raise ValueError(f"the query must use {' and '.join(missing)}")
        return query

    def tie_columns(self) -> tuple[str, ...]:
        """The <name>s of the query's {after_<name>} placeholders, in order of first use."""
        return tuple(dict.fromkeys(_TIE.findall(self.query)))
