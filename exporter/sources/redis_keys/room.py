"""How many keys one key-sampler cycle reads, and which: the source's max_keys over its groups.

Each key group is sure of an even share (max_keys / groups), and what a group does not use of
its share is lent to the groups that found more, split as water fills vessels: a group that
found less than the level keeps all it found, the others read up to the level, and the level
is as high as max_keys allows. So a group of 150,000 keys beside idle groups is read in full
under a max_keys of 200,000, and keys go unread only when the groups together found more than
max_keys; then a group that found few is still read in full (a queue's dead letters beside
100,000 discovered queues).

What the room holds, keys read and keys kept for later, never passes max_keys (about 1 KiB of
memory a key read). A group's keys within its share are read as they are found. Its keys
beyond it are kept while there is room: the names of scanned keys, or a count of the keys a
group builds from known values (their values are found before any SCAN, so the room knows
what each such group needs). When the room is full, a key beyond its share of a group that
keeps fewer such keys takes the place of one of the group that keeps the most, so what is kept
once every SCAN is done is the water-filled split; the kept scanned keys are then read
(`lent`), and the keys built from values cut to what each group kept (`fit`, before they are
built). A key that does not fit is counted and named once a cycle (reason too_many_keys).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum

from exporter.sources.redis_keys.types import FoundKey, GroupTally

# Kept keys handed back to be read at a time (`lent`): rounds go out while the rest waits.
LENT_PAGE = 1000


class Fate(Enum):
    """What became of a scanned key offered to the room for one group."""

    READ = "read"  # within the group's share: read now
    KEPT = "kept"  # beyond it: read once every SCAN is done, unless a group in need takes its place
    DROPPED = "dropped"  # no room: not read, counted


@dataclass
class _Beyond:
    """What a group found beyond its share that the room keeps for it."""

    tally: GroupTally
    keys: dict[bytes, FoundKey] = field(default_factory=dict)  # scanned: read once lent
    built: int = 0  # keys to be built from its values (a count: their values are known)

    def __len__(self) -> int:
        return len(self.keys) + self.built


class KeyRoom:
    """The keys one cycle may still read (see the module's docstring)."""

    def __init__(self, limit: int, groups: int) -> None:
        self.limit = limit
        self.share = max(limit // max(groups, 1), 1)
        self._within: dict[int, int] = {}  # per group: keys read (or to build) within its share
        self._beyond: dict[int, _Beyond] = {}
        self._held = 0  # keys read within shares, and kept beyond them
        self._most: _Beyond | None = None  # the group keeping most beyond its share
        self._unread: dict[int, tuple[GroupTally, int]] = {}
        # per group of keys built from values: its values (cut as the room shrinks) and how
        # many keys they built when claimed
        self._claimed: dict[int, tuple[GroupTally, dict[str, list[str]], int]] = {}

    def claim(self, tally: GroupTally, choices: dict[str, list[str]]) -> None:
        """A group whose keys are built from the values found this cycle (`choices`) claims
        them: within its share they are sure, beyond it kept as room allows (before any SCAN).
        The values of every group claimed so far are cut (in place) to what the room keeps for
        it now, which only shrinks: nine RQ groups of 100,000 queues each do not hold 900,000
        values until their keys are built."""
        keys = _keys(choices)
        self._claimed[id(tally)] = (tally, choices, keys)
        within = min(keys, self.share)
        self._within[id(tally)] = within
        self._held += within
        self._give_back(self._held - self.limit)  # shares lent to groups claimed before
        beyond = self._beyond_of(tally)
        wanted = keys - within
        room = min(wanted, max(self.limit - self._held, 0))
        beyond.built += room
        self._held += room
        wanted -= room
        while wanted and self._most is not None:  # room full: from the group keeping most
            moved = min(wanted, (len(self._most) - len(beyond)) // 2)  # until both keep as many
            if moved <= 0:
                break
            self._drop(self._most, moved)
            beyond.built += moved
            self._held += moved
            wanted -= moved
        self._grew(beyond)
        for claimed, values, _ in self._claimed.values():
            _cut(values, self._left(claimed))

    def take(self, tally: GroupTally, found: FoundKey) -> Fate:
        """What becomes of a key a SCAN found for the group."""
        within = self._within.get(id(tally), 0)
        if within < self.share:
            self._within[id(tally)] = within + 1
            self._held += 1
            self._give_back(self._held - self.limit)  # a share the room had lent
            return Fate.READ
        beyond = self._beyond_of(tally)
        if self._held >= self.limit:
            most = self._most
            if most is None or len(most) <= len(beyond) + 1:  # no group keeps more: no place
                self._count(1, tally)
                return Fate.DROPPED
            self._drop(most, 1)
        self._held += 1
        beyond.keys[found[0]] = found
        self._grew(beyond)
        return Fate.KEPT

    def within_shares(self, tallies: list[GroupTally], keys: int) -> bool:
        """Whether `keys` more keys of each of these groups would all be read within its share
        while the room keeps nothing beyond a share: then take() would answer READ to each and
        give nothing back, and took() counts them at once: a SCAN page's keys. At 100k keys the
        cycle's own CPU was 1.97x the floor's with a take() per key, 1.79x without
        (bench/key_sampling_split.py --before, docs/benchmarks.md)."""
        if self._held != sum(self._within.values()):  # keys kept beyond a share
            return False
        share, within = self.share, self._within
        return all(within.get(id(tally), 0) + keys <= share for tally in tallies)

    def took(self, tally: GroupTally, keys: int) -> None:
        """Keys of the group read within its share, as take() counts each (within_shares)."""
        self._within[id(tally)] = self._within.get(id(tally), 0) + keys
        self._held += keys

    def fit(self, choices: dict[str, list[str]], tally: GroupTally) -> None:
        """Cut a group's values (in place) so that the keys built from them are those it
        claimed and the room kept (the values of its largest placeholder cut, in their order),
        and count those it found beyond."""
        _, _, found = self._claimed.pop(id(tally))
        _cut(choices, self._left(tally))
        self._count(found - _keys(choices), tally)

    def lent(self) -> Iterator[tuple[GroupTally, list[FoundKey]]]:
        """The scanned keys kept beyond their groups' shares, a page at a time: read once every
        SCAN is done, with the room no group used."""
        for beyond in self._beyond.values():
            kept = list(beyond.keys.values())
            beyond.keys.clear()
            for start in range(0, len(kept), LENT_PAGE):
                yield beyond.tally, kept[start : start + LENT_PAGE]

    def report(self) -> None:
        """Count and name, once for the cycle, each group's keys not read."""
        for tally, unread in self._unread.values():
            tally.over_limit(unread, self.limit)

    def _left(self, tally: GroupTally) -> int:
        """The keys a group built from values may build: its share's and those kept for it."""
        return self._within.get(id(tally), 0) + self._beyond_of(tally).built

    def _beyond_of(self, tally: GroupTally) -> _Beyond:
        beyond = self._beyond.get(id(tally))
        if beyond is None:
            beyond = self._beyond[id(tally)] = _Beyond(tally)
        return beyond

    def _grew(self, beyond: _Beyond) -> None:
        if self._most is None or len(beyond) > len(self._most):
            self._most = beyond

    def _give_back(self, count: int) -> None:
        """Drop `count` kept keys (if so many are kept), always of the group keeping most."""
        while count > 0 and self._most is not None and len(self._most):
            most = self._most
            below = max((len(b) for b in self._beyond.values() if b is not most), default=0)
            dropped = min(count, max(len(most) - below, 1))
            self._drop(most, dropped)
            count -= dropped

    def _drop(self, beyond: _Beyond, count: int) -> None:
        """Give up `count` keys kept for a group: a count of keys to build first (counted when
        they are fitted), else the scanned keys kept last (counted now)."""
        built = min(count, beyond.built)
        beyond.built -= built
        dropped = min(count - built, len(beyond.keys))
        for _ in range(dropped):
            beyond.keys.popitem()
        if dropped:
            self._count(dropped, beyond.tally)
        self._held -= built + dropped
        # the group keeping most may be another now: looked for again (drops are few: a key
        # dropped for one arriving is the arriving one's, when its group keeps most)
        self._most = max(self._beyond.values(), key=len)

    def _count(self, unread: int, tally: GroupTally) -> None:
        if not unread:
            return
        _, before = self._unread.get(id(tally), (tally, 0))
        self._unread[id(tally)] = (tally, before + unread)


def _keys(choices: dict[str, list[str]]) -> int:
    """How many keys the values build: one per combination."""
    return math.prod(len(values) for values in choices.values())


def _cut(choices: dict[str, list[str]], left: int) -> None:
    """Cut the values of the largest placeholder (in their order) so that the keys they build
    are at most `left`."""
    keys = _keys(choices)
    if keys > left:
        largest = max(choices, key=lambda name: len(choices[name]))
        others = keys // len(choices[largest])
        choices[largest] = choices[largest][: left // others]
