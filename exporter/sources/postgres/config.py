"""The `sources.postgres` settings: a light model the configuration reads without psycopg.

psycopg is imported only to check a DSN that is given, and to report a secret file that
cannot be read (raised inside psycopg's pool, which retries it like a refused connection).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from exporter.core.logs import mask_connection_string, register_connection_secrets, register_secret
from exporter.core.models import StrictModel
from exporter.sources.postgres.collectors import SqlCollector, duplicate_custom_metrics
from exporter.sources.postgres.finished_config import FinishedRowsConfig

SslMode = Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"]


class PostgresSourceConfig(StrictModel):
    dsn: SecretStr | None = Field(
        None,
        description="postgresql:// URL or key=value string; a password in it is masked "
        "everywhere. Unset: the fields below and libpq's PG* variables",
    )
    dsn_file: Path | None = Field(None, description="file holding the DSN (read at each connect)")
    host: str | None = None
    port: int | None = Field(None, ge=1, le=65535)
    dbname: str | None = None
    user: str | None = None
    password: SecretStr | None = None
    password_file: Path | None = Field(
        None, description="file holding the password (read at each connect: rotation works)"
    )
    sslmode: SslMode | None = None
    sslrootcert: Path | None = None
    sslcert: Path | None = Field(None, description="client certificate")
    sslkey: Path | None = Field(None, description="client certificate's key")
    application_name: str = Field("queue-exporter", description="shown to DBAs in pg_stat_activity")
    connect_timeout: float = Field(
        5.0,
        gt=0,
        description="seconds a run waits for a pooled connection before it fails, and that "
        "opening one may take (libpq counts whole seconds, at least 2)",
    )
    pool_size: int = Field(2, ge=1, le=16, description="connections at most, shared by collectors")
    sample_interval: float | None = Field(
        None, gt=0, description="default seconds between collector runs (default: the global one)"
    )
    statement_timeout: float = Field(
        5.0,
        gt=0,
        description="default seconds a collector's query may run; a server that does not "
        "answer is cut off by the exporter after connect_timeout more",
    )
    collectors: list[SqlCollector] = Field(default_factory=list)
    finished: list[FinishedRowsConfig] = Field(
        default_factory=list,
        description="readers of the rows a job queue writes as jobs finish: completed, failed "
        "and retried counts, execution and wait times (native signals, leader only)",
    )

    @field_validator("collectors")
    @classmethod
    def _enabled_only(cls, collectors: list[SqlCollector]) -> list[SqlCollector]:
        # A preset offers exclusive variants of a collector (pgboss: the exact active count or
        # the planner's estimate), its params enabling one: the others are as if absent.
        return [collector for collector in collectors if collector.enabled]

    @field_validator("dsn")
    @classmethod
    def _parsable(cls, dsn: SecretStr | None) -> SecretStr | None:
        if dsn is not None:
            import psycopg
            from psycopg.conninfo import conninfo_to_dict

            try:
                conninfo_to_dict(dsn.get_secret_value())
            except psycopg.ProgrammingError:
                # The message would quote the DSN, password included: say only where.
                raise ValueError("not a valid PostgreSQL connection string") from None
        return dsn

    @model_validator(mode="after")
    def _consistent(self) -> PostgresSourceConfig:
        problems = []
        if self.dsn is not None and self.dsn_file is not None:
            problems.append("set dsn or dsn_file, not both")
        if self.password is not None and self.password_file is not None:
            problems.append("set password or password_file, not both")
        names = [collector.name for collector in self.collectors]
        for name in sorted({name for name in names if names.count(name) > 1}):
            problems.append(f"two collectors are named {name!r}")
        readers = [reader.name for reader in self.finished]
        for name in sorted({name for name in readers if readers.count(name) > 1}):
            problems.append(f"two finished-row readers are named {name!r}")
        problems += duplicate_custom_metrics(self.collectors)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def conninfo(self) -> str:
        if self.dsn_file is not None:
            dsn = _read_secret(self.dsn_file, "dsn_file")
            register_connection_secrets(dsn)  # libpq may quote it back in an error
            return dsn
        return self.dsn.get_secret_value() if self.dsn is not None else ""

    def connect_kwargs(self) -> dict[str, Any]:
        """Connection parameters beside the DSN (they win over the DSN's own)."""
        kwargs: dict[str, Any] = {
            "application_name": self.application_name,
            "connect_timeout": max(1, math.ceil(self.connect_timeout)),
        }
        for name in ("host", "port", "dbname", "user", "sslmode"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        for name in ("sslrootcert", "sslcert", "sslkey"):
            if getattr(self, name) is not None:
                kwargs[name] = str(getattr(self, name))
        if self.password_file is not None:
            kwargs["password"] = _read_secret(self.password_file, "password_file")
            register_secret(kwargs["password"])
        elif self.password is not None:
            kwargs["password"] = self.password.get_secret_value()
        return kwargs

    def masked_dsn(self) -> str | None:
        return mask_connection_string(self.dsn.get_secret_value()) if self.dsn else None


def _read_secret(path: Path, setting: str) -> str:
    import psycopg

    try:
        return path.read_text().strip()
    except OSError as error:
        # Raised inside the pool's connect: an OperationalError is retried like a refusal.
        raise psycopg.OperationalError(f"cannot read {setting} {path}: {error.strerror}") from None
