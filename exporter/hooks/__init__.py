"""Ready hooks: lifecycle events from a queue library's own extension points, one line to turn on.

Each module here (one a library) listens where its library announces a job's steps (Celery's
signals, RQ's worker and queue classes ...) and emits v1 events (docs/events.md) with the
producer library (exporter/lifecycle/producer.py): a bounded buffer, never blocking, drops
counted. Nothing imports these modules but the apps that use them: each imports its library,
which the exporter itself never needs. docs/hooks.md says how to turn each on.
"""
