"""queue-exporter: queue metrics sidecar for Redis queues, PostgreSQL queue tables and job events."""

# The one place the version is written: pyproject.toml reads it from here at build time
# (setuptools' attr:), so start-up needs no importlib.metadata (email, zipfile: ~35 ms).
__version__ = "0.1.0"
