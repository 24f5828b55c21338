"""`check-config --connect`: reach every backend once and say what serve would find there.

Each source kind's probe (config/kinds.py; its code lives with the kind, as
sources/redis_keys/probe.py) runs the code serve runs (one Redis key sampler cycle, one query
per SQL collector) so what it prints is what /metrics would show: per key group the keys matched with a few
examples and the series they give, per events stream its length, consumer groups and lag,
per SQL collector its rows and the series they give. A backend that cannot be reached is
named and makes the command fail; the others are still tried.

What would run but not as meant is a warning, named on a line of its own for the verdict
(`OK with N warnings`): a key group that matched nothing, a key of another Redis type than
its group's (the type found named), a database with no keys at all, queues found in Redis but
not configured (a group's `select` left them out), a native reader whose system has left no
record where it reads, and keys a group could not read. Each command a native reader will
send is tried in a harmless form (redis/acl.py COMMAND_TRIALS) under the configured user: one
refused is named with what the ACL (or the server) needs, a failure, or a warning when it costs
one figure only (BullMQ's and Bull's CLIENT LIST: their worker count). The Celery reader is run
for CELERY_WATCH seconds (two worker heartbeats): the workers its inspection found, with their
queues and slots, and a warning for workers that process tasks without sending task events
(-E missing), for tasks whose queue it could not learn, and for a worker of several queues
whose routes cannot be read (what would tell its tasks' queue).
"""

from __future__ import annotations

from exporter.config.kinds import KINDS
from exporter.config.settings import Config
from exporter.sources.probe import Echo, Findings, ProbeContext

__all__ = ["Findings", "probe"]


def probe(config: Config, echo: Echo) -> Findings:
    """Print what each backend holds for the configuration; the failures and warnings, named.
    A Redis one kind found unreachable is not tried again by the kinds after it."""
    findings = Findings()
    for kind in KINDS:
        context = ProbeContext(echo, config.sample_interval, findings.unreachable)
        findings.add(kind.probe(config, context))
    return findings
