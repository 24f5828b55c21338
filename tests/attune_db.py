"""Attune's tables and writes: the package's writers, shared with the demo workload."""

from exporter.demo.attune_db import STATUSES, UNFINISHED, Attune, schema_ddl

__all__ = ["STATUSES", "UNFINISHED", "Attune", "schema_ddl"]
