"""Which values an enumerated key group's placeholders take: parsing set members, selecting.

A placeholder's values are found in Redis (a set's members, the sets a key pattern matches, the
keys a pattern matches: sources/redis_keys/sampler.py reads them; a split_by label's values read from each
item: sources/redis_keys/commands.py, with a Selector) and then narrowed or added to by the group's `select`:
a plain name is taken whether found or not, a glob keeps the found values it matches. A value found but selected by nothing is reported: a queue that exists and is not
counted must be said, never silently left out.
"""

from __future__ import annotations

import fnmatch
import functools
import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from exporter.sources.redis_keys.groups import KeyGroup, fill, rebuilt
from exporter.sources.redis_keys.types import FoundKey, key_match

_GLOB = re.compile(r"[*?\[]")


@functools.lru_cache(maxsize=256)
def member_regex(pattern: str) -> re.Pattern[str]:
    """A regex for a set member format: {value} captures one or more characters, each {_name}
    wildcard any text, empty included (kombu's binding `<routing key>SEP<pattern>SEP<queue>`
    has an empty pattern for a direct exchange)."""
    body = rebuilt(pattern, re.escape, lambda name: "(?P<value>.+)" if name == "value" else ".*?")
    return re.compile(f"^{body}$", re.DOTALL)


def member_values(members: Iterable[bytes | str], member: str) -> set[str]:
    """The values the members of the form `member` name (members of another form name none)."""
    regex = member_regex(member)
    values = set()
    for item in members:
        found = regex.match(item.decode("utf-8", "replace") if isinstance(item, bytes) else item)
        if found:
            values.add(found.group("value"))
    return values


def select(found: Iterable[str], selection: list[str]) -> tuple[list[str], list[str]]:
    """(kept, left out): names in `selection` are kept whether found or not, globs keep the
    found values they match; the found values nothing selects are left out."""
    keeps = Selector(selection)
    kept = {value for value in found if keeps(value)}.union(keeps.names)
    return sorted(kept), sorted(keeps.left_out)


def names(selection: list[str]) -> list[str]:
    """The plain names of a selection: values taken whether found or not."""
    return [entry for entry in selection if not _GLOB.search(entry)]


def selects(selection: list[str], value: str) -> bool:
    """Whether the selection keeps `value` (a name of it, or a glob matching it)."""
    return any(
        fnmatch.fnmatchcase(value, entry) if _GLOB.search(entry) else value == entry
        for entry in selection
    )


class Selector:
    """A selection applied to values met one at a time (split_by's label values, read from
    each item): whether each is kept, each value decided once, and the ones left out."""

    def __init__(self, selection: list[str]) -> None:
        self.selection = selection
        self.every = "*" in selection  # the default: no value is left out, none looked at
        self.names = names(selection)
        self.left_out: list[str] = []
        self._decided: dict[str, bool] = {}

    def __call__(self, value: str) -> bool:
        if self.every:
            return True
        kept = self._decided.get(value)
        if kept is None:
            kept = self._decided[value] = selects(self.selection, value)
            if not kept:
                self.left_out.append(value)
        return kept


@dataclass
class BuiltKeys:
    """An enumerated group's keys as one cycle built them from its values (`choices`), in
    pages, and by combination of values: the next cycle reuses them whole when the values are
    the same, else combination by combination (bull at 10k queues, process CPU against the
    floor's: built once 2.54x -> 1.99x, reused whole 2.09x -> 1.67x; docs/benchmarks.md)."""

    choices: dict[str, list[str]]
    pages: list[list[FoundKey]]
    by_values: dict[tuple[str, ...], FoundKey]


def built_keys(
    group: KeyGroup, choices: dict[str, list[str]], size: int, last: BuiltKeys | None
) -> BuiltKeys:
    """Each combination of the group's placeholders' values (`choices`) as its key and what it
    gives, `size` a page; from `last` (the last cycle's) where it has them."""
    if last is not None and last.choices == choices:
        return last
    known = last.by_values if last is not None else {}
    names, by_values, built = list(choices), {}, []
    for values in itertools.product(*choices.values()):
        one = known.get(values)
        if one is None:
            found = dict(zip(names, values, strict=True))
            one = fill(group.pattern, found).encode(), key_match(group, found)
        by_values[values] = one
        built.append(one)
    pages = [built[start : start + size] for start in range(0, len(built), size)]
    return BuiltKeys(choices, pages, by_values)
