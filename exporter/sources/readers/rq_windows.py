"""Where the RQ reader got to in each finished and failed registry (issue 40).

RQ scores a registry member by when it expires: current_timestamp() (whole seconds) plus the
job's TTL (result_ttl, 500 s by default; failure_ttl, a year), `+inf` for a TTL of -1. With
one TTL what finishes later sorts later, and what finishes within one second shares one score,
ordered by member (job id) within it: a flood of 300,000 jobs in a second is one score.

A window remembers the last member it counted (`last`, in the registry's order: score, then
member), how many members of that score S it counted up to and with it (`at_last`) and which
(`at_members`, the first MAX_REMEMBERED), how many S held (`at_count`), and the members it
counted scored below S, from `floor` on (`below`: the newest MAX_REMEMBERED, whole scores). A
read asks, one pipeline for every registry:
- ZRANGEBYSCORE S S LIMIT at_last MAX_NEW: the members of S after the counted ones (a flood's
  next page: never again what was counted), and, unless S holds more than it counted,
  ZRANGEBYSCORE (S +inf LIMIT 0 MAX_NEW: the members after S;
- ZRANK of `last` less ZCOUNT -inf (S: its place in S, which tells whether a member was added
  to or removed from S before it (the page would then be off: S is read again, from its first
  member); ZCOUNT S S: whether S holds more than it counted, and whether members it had not
  read yet were removed (RQ's cleanup removes an expired score whole);
- ZCOUNT floor (S against `below`, after forgetting the members ordered before the registry's
  lowest (ZRANGE 0 0: RQ's cleanup removes the lowest scores): a member added below S (a job of
  a shorter TTL) is found by a count that changed, and that range is read again, MAX_NEW past
  what it remembers; when more are late than that, the next reads read it again for the
  rest, and the members after S wait until the late ones are counted.
So an idle registry costs seven small replies, whatever it keeps. A range read again returns
what was counted too: a member added below S is rare (a shorter TTL than the newest jobs'), a
read of S again rarer (a member added before `last` in the second the reader read). What cannot
be told counted or not is counted once per registry and read as `over_limit`, never silently:
members of S removed before they were read (its second expired: RQ's cleanup), late members
left unread that fell below what it remembers, a score read again whose counted members were
more than it remembers. Not seen: a member added below `floor` (a TTL much shorter than the
others', in a registry keeping more than MAX_REMEMBERED).
The window moves only once the whole read succeeded (framework.Progress).

The first read is the baseline, at the newest members: the MAX_REMEMBERED newest (ZRANGE -N
-1), and how many share the newest score; what finished before is not counted. A registry
first read later (a new queue) is read from its start: counted in full.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import redis

from exporter.sources.readers.framework import Signals

# New members taken per registry and read; the rest at the next read.
MAX_NEW = 10_000
# Counted members a window remembers below its last score, and at it (each).
MAX_REMEMBERED = 10_000
_Scored = list[tuple[str, float]]
_K = TypeVar("_K")


@dataclass(frozen=True, slots=True)
class RegistryWindow:
    """What the reader counted of one registry (the module's docstring). `last` None: nothing
    counted or seen yet, the registry is read from its start."""

    last: tuple[float, str] | None = None
    at_last: int = 0
    at_members: frozenset[str] = frozenset()
    at_complete: bool = True  # at_members holds every member of last's score it counted
    # members of last's score at the last read; None: more than a read took, not counted yet
    at_count: int | None = 0
    below: Mapping[str, float] = field(default_factory=dict)
    floor: float = -math.inf

    @property
    def behind(self) -> bool:
        """Last's score held more members than it counted: they come first."""
        return self.at_count is None or self.at_count > self.at_last

    def lost(self, at_count: int) -> bool:
        """Whether `at_count` members of last's score now mean that some it had not read yet
        were removed (RQ's cleanup removes an expired score whole)."""
        if not self.behind:
            return False
        return at_count < (self.at_last if self.at_count is None else self.at_count)

    @property
    def knows_at_last(self) -> bool:
        """Whether it remembers every member of last's score it counted (some may sort after
        `last`: counted before a read of the score again found members added before them)."""
        return self.at_complete

    def after(
        self, members: _Scored, at_count: int | None = None, cut: bool = False
    ) -> RegistryWindow:
        """This window moved past `members` (new, in the registry's order): last's score
        gets those of its own score, `below` those before the new last's. `at_count`: how many
        members the new last's score holds, if read; else all of it was taken unless the read
        was `cut` at its limit."""
        if not members:
            return replace(self, at_count=self.at_count if at_count is None else at_count)
        last = members[-1][1], members[-1][0]
        same = [m for m, s in members if s == last[0]]
        if self.last is not None and last[0] == self.last[0]:  # more of the same score
            at_last, at_members = self.at_last + len(same), self.at_members | set(same)
            below, floor = self.below, self.floor
        else:
            at_last, at_members = len(same), frozenset(same)
            below, floor = dict(self.below), self.floor
            if self.last is not None and self.knows_at_last:
                below.update(dict.fromkeys(self.at_members, self.last[0]))
            elif self.last is not None:  # not all of last's score remembered: from past it
                floor, below = math.nextafter(self.last[0], math.inf), {}
            below.update((m, s) for m, s in members if s < last[0])
        if at_count is None and not cut:
            at_count = at_last
        complete = self.at_complete if self.last is not None and last[0] == self.last[0] else True
        window = RegistryWindow(last, at_last, at_members, complete, at_count, below, floor)
        return _trimmed(window)


def _trimmed(window: RegistryWindow) -> RegistryWindow:
    """At most MAX_REMEMBERED members below and at last's score: below, the newest whole
    scores (the floor rises past the rest, so that ZCOUNT from it stays comparable); at it,
    the last counted (the others are not told from new ones if the score is read again)."""
    at_members, complete = window.at_members, window.at_complete
    if len(at_members) > MAX_REMEMBERED and window.last is not None:
        # those sorting after `last` (counted before a read again) are kept: its next pages
        # would count them again; they are fewer than MAX_REMEMBERED (what it remembered)
        after = {m for m in at_members if m > window.last[1]}
        room = max(MAX_REMEMBERED - len(after), 0)
        before = sorted(at_members - after)[-room:] if room else []
        at_members, complete = frozenset(after.union(before)), False
    below, floor = dict(window.below), window.floor
    if len(below) > MAX_REMEMBERED:
        cut = sorted(below.values(), reverse=True)[MAX_REMEMBERED]  # this score and lower go
        floor = math.nextafter(cut, math.inf)
        below = {m: s for m, s in below.items() if s > cut}
    return replace(window, at_members=at_members, at_complete=complete, below=below, floor=floor)


def _bound(score: float, exclusive: bool = False) -> str:
    """A score as ZRANGEBYSCORE and ZCOUNT take it."""
    text = "+inf" if score == math.inf else "-inf" if score == -math.inf else repr(score)
    return f"({text}" if exclusive else text


def _scored(reply: Any) -> _Scored:
    return [(m.decode("utf-8", "replace"), float(s)) for m, s in reply]


def _checked(*replies: Any) -> None:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


def baseline_windows(
    client: redis.Redis, keys: Sequence[tuple[_K, str]], signals: Signals
) -> dict[_K, RegistryWindow]:
    """Each readable registry's window at its newest members (nothing before counted)."""
    pipe = client.pipeline(transaction=False)
    for _, key in keys:
        pipe.zrange(key, -MAX_REMEMBERED, -1, withscores=True)
    newest: dict[_K, _Scored] = {}
    for (name, key), reply in zip(keys, pipe.execute(raise_on_error=False), strict=True):
        with signals.record(key):
            _checked(reply)
            newest[name] = _scored(reply)
    pipe = client.pipeline(transaction=False)
    kept = [(name, key) for name, key in keys if newest.get(name)]
    for name, key in kept:  # how many share the newest score (maybe more than were read)
        pipe.zcount(key, _bound(newest[name][-1][1]), _bound(newest[name][-1][1]))
    # an empty registry: its first members are all new (from its start)
    windows = {name: RegistryWindow() for name, members in newest.items() if not members}
    for (name, key), count in zip(kept, pipe.execute(raise_on_error=False), strict=True):
        with signals.record(key):
            _checked(count)
            members = newest[name]
            score = members[-1][1]
            floor = -math.inf
            if len(members) >= MAX_REMEMBERED:  # more below the lowest score read: unread
                floor = math.nextafter(members[0][1], math.inf)
            below = {m: s for m, s in members if floor <= s < score}
            at = frozenset(m for m, s in members if s == score)
            # all of the newest score is taken as counted, read or not
            last, complete = (score, members[-1][0]), len(at) == count
            window = RegistryWindow(last, count, at, complete, count, below, floor)
            windows[name] = _trimmed(window)
    return windows


@dataclass(slots=True)
class _Read:
    """One registry's replies to a read, and what its follow-ups found."""

    key: str
    old: RegistryWindow
    page: _Scored = field(default_factory=list)  # of last's score, after the counted
    after: _Scored = field(default_factory=list)  # after last's score
    after_limit: int = MAX_NEW  # how many of them were asked for
    after_again: bool = False  # asked after the page read last's score to its end
    at_count: int = 0  # members of last's score now
    again_at: bool = False  # last's score is read again
    again_below: bool = False  # the members below it are read again
    below: dict[str, float] = field(default_factory=dict)  # old.below less the trimmed


def read_windows(
    client: redis.Redis, windows: Mapping[_K, tuple[str, RegistryWindow]], signals: Signals
) -> dict[_K, tuple[RegistryWindow, list[str]]]:
    """Each readable registry's window after this read, and the members new in it (in its
    order); a registry whose replies failed is left out (counted and named by signals)."""
    pipe = client.pipeline(transaction=False)
    for key, old in windows.values():
        if old.last is None:
            pipe.zrange(key, 0, MAX_NEW - 1, withscores=True)
            continue
        score, member = old.last
        pipe.zrangebyscore(key, _bound(score), _bound(score), old.at_last, MAX_NEW, True)
        if not old.behind:
            pipe.zrangebyscore(key, _bound(score, True), "+inf", 0, MAX_NEW, True)
        pipe.zrank(key, member)
        pipe.zcount(key, "-inf", _bound(score, True))
        pipe.zcount(key, _bound(score), _bound(score))
        pipe.zcount(key, _bound(old.floor), _bound(score, True))
        pipe.zrange(key, 0, 0, withscores=True)
    replies = iter(pipe.execute(raise_on_error=False))
    reads: dict[_K, _Read] = {}
    again = client.pipeline(transaction=False)
    for name, (key, old) in windows.items():
        if old.last is None:
            first = next(replies)
            with signals.record(key):
                _checked(first)
                reads[name] = _Read(key, old, after=_scored(first))
            continue
        page = next(replies)
        after = [] if old.behind else next(replies)
        rank, before_score, at_count, from_floor, lowest = (next(replies) for _ in range(5))
        with signals.record(key):
            _checked(page, after, rank, before_score, at_count, from_floor, lowest)
            one = _Read(key, old, _scored(page), _scored(after), at_count=int(at_count))
            one.below = _without_trimmed(old.below, _scored(lowest))
            # nothing counted of last's score (all of it gone): its page is all new
            one.again_at = old.at_last > 0 and (
                rank is None or rank - before_score != old.at_last - 1
            )
            one.again_below = from_floor != len(one.below)
            _ask_again(again, one)
            reads[name] = one
    replies = iter(again.execute(raise_on_error=False) if len(again) else [])
    moved: dict[_K, tuple[RegistryWindow, list[str]]] = {}
    for name, one in reads.items():
        at = [] if not one.again_at else [next(replies)]
        if one.again_at and not one.old.knows_at_last:
            at.append(next(replies))
        below = next(replies) if one.again_below else None
        after = next(replies) if one.after_again else []
        with signals.record(one.key):
            _checked(*at, below, after)
            one.after = one.after or _scored(after)
            moved[name] = _moved(one, at, below, signals)
    return moved


def _ask_again(again: Any, one: _Read) -> None:
    """The follow-up reads of a registry whose counts changed where it counted."""
    old = one.old
    assert old.last is not None
    score = old.last[0]
    if one.again_at and old.knows_at_last:  # all of last's score: what it remembers and
        limit = len(old.at_members) + MAX_NEW  # MAX_NEW more
        again.zrangebyscore(one.key, _bound(score), _bound(score), 0, limit, True)
    elif one.again_at:  # what it counted there cannot be told: the score's end
        again.zrevrangebyscore(one.key, _bound(score), _bound(score), 0, 1, True)
        again.zcount(one.key, _bound(score), _bound(score))
    if one.again_below:
        limit = len(one.below) + MAX_NEW
        again.zrangebyscore(one.key, _bound(old.floor), _bound(score, True), 0, limit, True)
    ended = old.at_last + len(one.page) >= one.at_count  # this page read the score to its end
    if old.behind and not one.again_at and ended and len(one.page) < MAX_NEW:
        one.after_again, one.after_limit = True, MAX_NEW - len(one.page)
        again.zrangebyscore(one.key, _bound(score, True), "+inf", 0, one.after_limit, True)


def _without_trimmed(below: Mapping[str, float], lowest: _Scored) -> dict[str, float]:
    """The members remembered that are not ordered before the registry's lowest now (gone
    since: RQ's cleanup removes the expired, the lowest scores); none when it is empty."""
    if not lowest:
        return {}
    first = (lowest[0][1], lowest[0][0])
    return {m: s for m, s in below.items() if (s, m) >= first}


def _moved(
    one: _Read, at: list[Any], below: Any, signals: Signals
) -> tuple[RegistryWindow, list[str]]:
    """The window after a read's replies, and the members new in it."""
    old, new = one.old, []
    window = replace(old, below=one.below)
    unread_from = math.inf  # late members from this score on were left for the next read
    if below is not None:  # late members below last's score: those it does not remember
        members = _scored(below)
        new += [m for m, _ in members if m not in one.below]
        if len(members) >= len(one.below) + MAX_NEW:  # more may be late than a read takes
            unread_from = members[-1][1]
        window = replace(window, below={**one.below, **dict(members)})
    # the members after last's score wait while late ones are left: MAX_NEW new a read
    room = MAX_NEW - len(new) if unread_from == math.inf else 0
    moved, found, lost = _moved_on(one, window, at, room)
    # late members left unread fell below what it remembers
    if lost or moved.floor > unread_from:  # said once per registry and read
        signals.tally.refuse("over_limit")
    return moved, new + found


def _moved_on(
    one: _Read, window: RegistryWindow, at: list[Any], room: int
) -> tuple[RegistryWindow, list[str], bool]:
    """The window moved on from last's score (`at`: its replies when read again), the
    members new there and after it (`room` of those after it at most), and whether some
    could not be counted."""
    old, new = one.old, []
    if old.last is None:  # read from the registry's start
        cut = len(one.after) >= MAX_NEW
        return _trimmed(window.after(one.after, cut=cut)), [m for m, _ in one.after], False
    lost = old.lost(one.at_count)  # removed before they were read
    if at and window.knows_at_last:
        window, found = _read_again(window, _scored(at[0]), one.at_count)
        new += found
    elif at:  # what it counted of last's score cannot be told from the rest: past its end
        lost = True
        greatest, count = at
        last = old.last if not greatest else (old.last[0], _scored(greatest)[0][0])
        window = replace(window, last=last, at_last=int(count), at_count=int(count))
    else:  # a member it counted comes again only after more were added before it than
        window = window.after(one.page, one.at_count)  # a read took
        new += [m for m, _ in one.page if m not in old.at_members]
    if not window.behind and one.after:  # last's score read to its end: the members after
        taken = one.after[: max(room - len(new), 0)]  # MAX_NEW new a read in all
        cut = len(taken) < len(one.after) or len(one.after) >= one.after_limit
        window = window.after(taken, cut=cut)
        new += [m for m, _ in taken]
    return _trimmed(window), new, lost


def _read_again(
    window: RegistryWindow, members: _Scored, at_count: int
) -> tuple[RegistryWindow, list[str]]:
    """Last's score read again from its first member (a member added or removed before
    `last`; it remembers what it counted there): the window after it and the members new."""
    assert window.last is not None
    names = [m for m, _ in members]
    new = [m for m in names if m not in window.at_members]
    at_members = window.at_members | set(names)  # those counted that sort after it too
    last = window.last if not names else (window.last[0], names[-1])
    moved = replace(window, last=last, at_last=len(names), at_members=at_members, at_count=at_count)
    return _trimmed(moved), new
