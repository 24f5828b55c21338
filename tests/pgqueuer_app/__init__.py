"""PgQueuer's app and driver for the conformance harness, run with the pgqueuer1 venv's Python."""
