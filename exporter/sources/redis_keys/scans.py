"""Which SCANs a key sampler's cycle runs: one shared by its scanned key groups, or one each.

Why share: a full SCAN makes Redis visit every key of the database, whatever MATCH says, so
groups scanned apart pay for that pass once each: Orchestrata's queue and dead-letter groups
among 100k other keys cost Redis 7.0 182 ms a cycle apart and 92 ms in one shared pass (7.2
and 7.4: 108-111 ms and 55 ms; per key, bench/scan_cost.py and docs/benchmarks.md). A shared
SCAN's MATCH is the groups' common literal prefix ("orchestrata:*"; "*" when they have none),
and the sampler matches each key it returns against every group's pattern.

The price is the keys under that prefix that no group takes (an app's job hashes beside its
queues, Runner-Q's activity hashes under "*"): each is sent and passed over for nothing. So
each shared cycle is checked: while it returns no more unclaimed keys than claimed ones (plus
a SCAN page), the groups go on sharing; past that they are scanned apart, and sharing is tried
again RETRY_AFTER cycles later, since keyspaces change.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NamedTuple

from exporter.core.logs import LogLimiter
from exporter.sources.redis_keys.groups import KeyGroup, scan_glob, shared_glob

log = logging.getLogger(__name__)

# Cycles scanned apart after a shared SCAN returned too many keys no group took.
RETRY_AFTER = 10


class KeyScan(NamedTuple):
    """One SCAN of a cycle: its MATCH glob, and the positions (in the sampler's key groups) of
    the groups it finds keys for."""

    glob: str
    groups: tuple[int, ...]


class ScanPlan:
    """The SCANs of each cycle for a sampler's key groups (those whose keys are scanned, not
    built from values), shared while sharing pays (see the module's docstring)."""

    def __init__(self, source: str, groups: Sequence[KeyGroup], page: int) -> None:
        self.source = source
        scanned = [(index, group) for index, group in enumerate(groups) if not group.enumerated]
        self.apart = [KeyScan(scan_glob(group.pattern), (index,)) for index, group in scanned]
        self.shared: KeyScan | None = None
        if len(scanned) > 1:
            glob = shared_glob([group.pattern for _, group in scanned])
            self.shared = KeyScan(glob, tuple(index for index, _ in scanned))
        self.page = page  # a SCAN page's worth of unclaimed keys is always let pass
        self._cycles = 0
        self._share_from = 0  # the cycle from which sharing is tried again
        self._log = LogLimiter(log)

    def scans(self) -> list[KeyScan]:
        """This cycle's SCANs."""
        self._cycles += 1
        if self.shared is None or self._cycles < self._share_from:
            return self.apart
        return [self.shared]

    def shared_scan_found(self, scan: KeyScan, claimed: int, unclaimed: int) -> None:
        """What the shared SCAN returned this cycle: keys some group took, and keys none did."""
        if unclaimed > claimed + self.page:
            self._share_from = self._cycles + 1 + RETRY_AFTER
            self._log.log(
                logging.INFO,
                "apart",
                "%s: the shared SCAN MATCH %r returned %d key(s) no key group takes, against %d "
                "taken: the next %d cycles scan each group apart",
                self.source,
                scan.glob,
                unclaimed,
                claimed,
                RETRY_AFTER,
            )
