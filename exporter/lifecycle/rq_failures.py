"""RQ's record of a failed job read as the wire's error_type: one reading for the RQ hook (in
the worker, exporter/hooks/rq.py) and the RQ reader (from Redis, sources/readers/rq.py)."""

from __future__ import annotations

# What RQ writes of a job whose work horse died under it: AbandonedJobError (RQ 2 and later),
# its reaper's "Moved to FailedJobRegistry", a horse "terminated unexpectedly".
_WORKER_LOST = ("AbandonedJobError", "Moved to FailedJobRegistry", "terminated unexpectedly")


def rq_error_type(exc_text: str) -> str:
    """RQ's failed registry holds jobs with no attempt left: final (non_retryable), unless RQ
    timed the job out (timeout) or lost its work horse (other)."""
    if "JobTimeoutException" in exc_text:
        return "timeout"
    if any(marker in exc_text for marker in _WORKER_LOST):
        return "other"
    return "non_retryable"
