"""queue-exporter: queue metrics sidecar for Redis queues, PostgreSQL queue tables and job events."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("queue-exporter")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"
