"""The Redis key sampler: depth and head-of-queue age of every key that matches a key group.

One cycle: find the keys (one SCAN MATCH shared by the scanned groups while that pays, else
one per group: sources/redis_keys/scans.py; or keys built from enumerated values), read them in pipelines of
`pipeline_size` commands (one depth command per key or priority band, one for the head item,
one for the due count: sources/redis_keys/commands.py), each round carrying the next SCAN, then the follow-up
reads of the items that point at a hash (RQ jobs, BullMQ jobs) or at a stream position. On a
Redis Cluster every shard is scanned at once, the keys its SCAN finds read on it, each node's
next round sent as soon as its own replies are in (sources/redis_keys/rounds.py).

Each cycle also tallies, per key group, the keys it matched, the series they gave and what
could not be read (key, reason). The tallies go into the cycle's report (sources/source.py),
which the runner puts on the HealthBoard and counts; problems are logged at WARNING naming
group, key and reason, rate-limited: a typo in a pattern must not look like an empty queue.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections.abc import Iterator

import redis

from exporter.core.logs import LogLimiter
from exporter.output.catalog import SOURCE_LABEL
from exporter.redis.cluster import ClusterNodes
from exporter.redis.connection import follow_failover, redis_error_reason, sever
from exporter.redis.members import members_of
from exporter.sources.redis_keys.commands import Cycle, GroupReads, Learned
from exporter.sources.redis_keys.config import RedisSourceConfig
from exporter.sources.redis_keys.groups import (
    OrderedGroup,
    SetMembers,
    key_regex,
    literal_prefix,
    placeholders,
    scan_glob,
)
from exporter.sources.redis_keys.items import response_reason
from exporter.sources.redis_keys.look_alikes import look_alikes
from exporter.sources.redis_keys.room import Fate, KeyRoom
from exporter.sources.redis_keys.rounds import Transport
from exporter.sources.redis_keys.scans import KeyScan, ScanPlan
from exporter.sources.redis_keys.types import FoundKey, GroupTally, Route, key_match, text
from exporter.sources.redis_keys.values import BuiltKeys, built_keys, member_values, select
from exporter.sources.source import SourceReport

log = logging.getLogger(__name__)

# A group that finds nothing, in plain words: scanned keys vanish when their queue empties
# (Redis deletes an empty list or zset), keys built from values do not.
_NO_KEYS = (
    "matched no keys: a typo in the pattern or the wrong database, or every queue of it is "
    "empty (Redis deletes empty keys)"
)
_NO_KEYS_ENUMERATED = "matched no keys: the values or set that name its queues are empty"


def redis_samplers(
    redis: RedisSourceConfig | list[RedisSourceConfig] | None,
    default_interval: float,
) -> list[RedisKeySampler]:
    """A key sampler per Redis with key groups. Several Redis sources are each named
    redis:<name> and their series carry redis_source="<name>"; one alone is plain "redis",
    its series as they always were."""
    if not isinstance(redis, list):
        one = [redis] if redis is not None and redis.key_groups else []
        return [RedisKeySampler(config, default_interval) for config in one]
    return [
        RedisKeySampler(config, default_interval, source_label=config.name)
        for config in redis
        if config.key_groups
    ]


class RedisKeySampler:
    def __init__(
        self,
        config: RedisSourceConfig,
        default_interval: float,
        source_label: str | None = None,
    ) -> None:
        self.name = "redis" if source_label is None else f"redis:{source_label}"
        self.source_label = source_label
        self.config = config
        self.interval = config.sample_interval or default_interval
        self.deadline = config.cycle_timeout or self.interval
        self._client: redis.Redis | None = None
        self._regexes = {group.pattern: key_regex(group.pattern) for group in config.key_groups}
        # A key not starting with a pattern's literal prefix is not the pattern's: a shared
        # SCAN's keys of other groups, and of none, are told apart without a regex
        self._prefixes = {
            group.pattern: literal_prefix(group.pattern).encode() for group in config.key_groups
        }
        self._warnings = LogLimiter(log)
        self._reported_once = False
        self._nodes: ClusterNodes | None = None  # a Redis Cluster's (redis+cluster:// URLs)
        # The SCANs of each cycle: one shared by the scanned groups while that pays, or one each
        self._scan_plan = ScanPlan(self.name, config.key_groups, config.scan_count)
        self._learned = Learned()  # what the last cycle found that the next one reuses
        self._room = KeyRoom(config.max_keys, len(config.key_groups))  # what a cycle may read

    # -- Source protocol -------------------------------------------------------------------

    def sample(self) -> SourceReport:
        client = self._connect()
        follow_failover(client)  # behind Sentinel: this cycle reads the master of now
        if self._nodes is not None:
            self._nodes.refresh_if_moved()
        tallies = [GroupTally(group, self.name, self._warnings) for group in self.config.key_groups]
        cycle = Cycle(time.time(), tallies, self.config.max_item_bytes, self._nodes, self._learned)
        self._room = KeyRoom(self.config.max_keys, len(self.config.key_groups))
        # Commands stream through in pipeline-sized rounds while SCAN goes on, so a cycle holds
        # about a round of commands at a time, however large the keyspace.
        rounds = Transport(cycle, client, self._nodes, self.config.pipeline_size)
        try:
            self._sample_groups(cycle, rounds)
        finally:  # a cycle that failed leaves no reply unread on a connection
            rounds.abandon()
        self._learned = cycle.learned
        cycle.finish()
        samples = cycle.samples
        if self.source_label is not None:
            samples = samples.with_label(SOURCE_LABEL, self.source_label)
        return self._report(tallies, SourceReport(samples))

    def _sample_groups(self, cycle: Cycle, rounds: Transport) -> None:
        """Find and read every key group's keys."""
        tallies = cycle.tallies
        bulk = {
            id(t): GroupReads(t, cycle, t.group)
            for t in tallies
            if GroupReads.suits(t.group) and len(t.group.types) == 1
        }

        def read(tally: GroupTally, page: list[FoundKey]) -> None:
            if len(tally.group.types) > 1:  # each key's TYPE first
                rounds.add(cycle.typed_reads(tally, page))
                return
            reads = bulk.get(id(tally))
            if reads is not None:
                rounds.add_run(reads, page)
                return
            # a page's commands added at once: routed and sent in full rounds once a page
            commands = (cycle.commands_for_key(tally, tally.group, *found) for found in page)
            rounds.add(itertools.chain.from_iterable(commands))

        # the values of the groups whose keys are built from them first: what each will build
        # is known before any SCAN, so the room lends to the others what they leave unused
        enumerated: list[tuple[GroupTally, dict[str, list[str]]]] = []
        for tally in tallies:
            choices = self._choices(cycle, tally, rounds)
            if choices is not None:
                self._room.claim(tally, choices)
                enumerated.append((tally, choices))
        for scan in self._scan_plan.scans():
            members = [tallies[index] for index in scan.groups]
            for tally, page in self._scanned_pages(cycle, scan, members, rounds):
                tally.matched(page)
                read(tally, page)
        for tally, choices in enumerated:
            for page in self._built_pages(cycle, tally, choices, rounds):
                tally.built(page)  # which exist, their depth reads tell
                read(tally, page)
        for tally, page in self._room.lent():  # scanned keys beyond a share, read with the
            tally.matched(page)  # room the other groups left unused
            read(tally, page)
        rounds.flush()
        self._room.report()

    def error_reason(self, error: Exception) -> str:
        return redis_error_reason(error)

    def interrupt(self) -> None:
        if self._nodes is not None:
            self._nodes.sever()
        sever(self._client)

    def close(self) -> None:
        if self._nodes is not None:
            self._nodes.close()
        elif self._client is not None:
            self._client.close()

    def _report(self, tallies: list[GroupTally], report: SourceReport) -> SourceReport:
        """The cycle's findings in its report (the runner puts them on the HealthBoard); the
        first cycle's also in the log."""
        for tally in tallies:
            if tally.group.enumerated:  # its queues named and empty read 0: the truth
                if tally.named == 0:
                    tally.warn("no_keys", _NO_KEYS_ENUMERATED)
            elif tally.keys == 0:
                tally.warn("no_keys", _NO_KEYS)
        level = logging.DEBUG if self._reported_once else logging.INFO
        self._reported_once = True
        report.key_groups = [tally.report() for tally in tallies]  # its queues counted once
        for group in report.key_groups:
            log.log(
                level,
                "key group %r (system %s, %s): %d key(s) matched, %d queue(s), %d series%s",
                group.pattern,
                group.system,
                group.type,
                group.keys_matched,
                group.queues,
                group.series,
                f", errors {group.errors}" if group.errors else "",
            )
        for tally in tallies:
            tally.count_into(report)
        return report

    # -- finding keys and running commands ------------------------------------------------------

    def _connect(self) -> redis.Redis:
        replicas = self.config.read_from == "replica"
        if self.config.is_cluster:
            if self._nodes is None:
                self._nodes = ClusterNodes(self.config.connect_cluster(replicas), replicas)
            return self._nodes.primaries()[0][1]  # commands go by key (Transport)
        if self._client is None:
            self._client = self.config.connect(replica=replicas)
        return self._client

    def _scan(
        self, cycle: Cycle, glob: str, tallies: list[GroupTally], rounds: Transport
    ) -> Iterator[list[bytes]]:
        """The keys SCAN MATCH `glob` finds for the groups, a page at a time (a SCAN reply's;
        on a cluster a node's, every shard scanned at once): a page's keys are matched and
        queued in one loop, not a generator step each, and read with its node's next SCAN. A
        cluster node that does not answer loses the groups their keys: withdrawn this cycle,
        unless no node answered (then the rounds raise)."""
        for name, page in rounds.scan(glob, self.config.scan_count):
            if isinstance(page, redis.RedisError):
                detail = f"node {name}: {redis_error_reason(page)}"
                for tally in tallies:
                    cycle.lose_group(tally, glob.encode(), detail)
                continue
            yield page  # while rounds.into is its node: the keys' reads go there

    def _scanned_pages(
        self, cycle: Cycle, scan: KeyScan, tallies: list[GroupTally], rounds: Transport
    ) -> Iterator[tuple[GroupTally, list[FoundKey]]]:
        """The keys one SCAN finds, each group's with what each gives, a page at a time."""
        # this cycle's keys read or kept (KeyRoom), which also tells a key seen already: SCAN
        # may return one twice (a key found last cycle gives what it gave then, no regex and no
        # new labels: at 100k keys a cycle cost 1.2-1.4x the floor's CPU this way, 2.2-2.5x
        # matched anew; docs/benchmarks.md)
        routes: dict[bytes, Route] = {}
        cycle.learned.routes[scan.groups] = routes
        last_cycle = cycle.before.routes.get(scan.groups, {})
        claimed = unclaimed = 0  # keys some group took, and none: a shared SCAN's price
        prefixes = tuple(self._prefixes[tally.group.pattern] for tally in tallies)
        for keys in self._scan(cycle, scan.glob, tallies, rounds):
            pages: list[list[FoundKey]] = [[] for _ in tallies]
            every_read = self._room.within_shares(tallies, len(keys))
            counts = self._paged(keys, tallies, prefixes, routes, last_cycle, pages, every_read)
            claimed, unclaimed = claimed + counts[0], unclaimed + counts[1]
            for tally, page in zip(tallies, pages, strict=True):
                if page:
                    yield tally, page
        if len(tallies) > 1:
            self._scan_plan.shared_scan_found(scan, claimed, unclaimed)

    def _paged(
        self,
        keys: list[bytes],
        tallies: list[GroupTally],
        prefixes: tuple[bytes, ...],
        routes: dict[bytes, Route],
        last_cycle: dict[bytes, Route],
        pages: list[list[FoundKey]],
        every_read: bool,
    ) -> tuple[int, int]:
        """A SCAN page's keys onto their groups' pages; the keys some group took, and none.
        `every_read` (KeyRoom.within_shares): each key is read and the room counts the page at
        once, not with a take() per key, which at 100k keys took the cycle's own CPU from 1.97x
        the floor's to 1.79x (bench/key_sampling_split.py --before, docs/benchmarks.md). Else
        the room takes each key: read now, kept to be read once every SCAN is done, or dropped."""
        claimed = unclaimed = 0
        for key in keys:
            if key in routes:  # SCAN may return a key twice
                continue
            route = last_cycle.get(key)
            if route is None:
                route = self._route(key, tallies) if key.startswith(prefixes) else ()
                if not route:
                    unclaimed += 1
                    continue
            claimed += 1
            if every_read:
                routes[key] = route
                for index, found in route:
                    pages[index].append(found)
                continue
            placed = False
            for index, found in route:
                fate = self._room.take(tallies[index], found)
                if fate is Fate.READ:
                    pages[index].append(found)
                placed = placed or fate is not Fate.DROPPED
            if placed:  # a key dropped at once is not remembered: a group may find millions
                routes[key] = route
        if every_read:
            for tally, page in zip(tallies, pages, strict=True):
                self._room.took(tally, len(page))
        return claimed, unclaimed

    def _route(self, key: bytes, tallies: list[GroupTally]) -> Route:
        """The groups (positions in `tallies`) whose pattern the key matches, and what it gives
        each."""
        text = key.decode("utf-8", "replace")
        route = []
        for index, tally in enumerate(tallies):
            pattern = tally.group.pattern
            if not key.startswith(self._prefixes[pattern]):
                continue
            found = self._regexes[pattern].match(text)
            if found:
                captured: dict[str, str] = found.groupdict()
                route.append((index, (key, key_match(tally.group, captured))))
        return tuple(route)

    def _choices(
        self, cycle: Cycle, tally: GroupTally, rounds: Transport
    ) -> dict[str, list[str]] | None:
        """The values each placeholder of a group built from values takes this cycle (None: a
        group whose keys are scanned, or whose one set is not a set: lost)."""
        group = tally.group
        if not group.enumerated:
            return None
        choices = {name: list(values) for name, values in group.values.items()}
        for name, members in group.values_from_set.items():
            from_set = self._values_from_set(cycle, members, tally, rounds)
            if from_set is None:
                return None
            choices[name] = sorted(from_set.union(choices.get(name, [])))
        for name, keys in group.values_from_keys.items():
            patterns = [keys] if isinstance(keys, str) else keys
            found = [self._scanned(cycle, pattern, tally, rounds, "value") for pattern in patterns]
            if name in choices or len(found) > 1:
                found = [sorted(set(choices.get(name, [])).union(*found))]
            choices[name] = found[0]  # sorted, each once, as _scanned gives them
        for name, regex in group.values_exclude.items():
            excluded = re.compile(regex)
            choices[name] = [value for value in choices[name] if not excluded.fullmatch(value)]
        for name, selection in group.select.items():
            if name in choices:  # else split_by's label: selected item by item (key_commands)
                choices[name], left_out = select(choices[name], selection)
                tally.left_out(name, left_out)
        return choices

    def _built_pages(
        self, cycle: Cycle, tally: GroupTally, choices: dict[str, list[str]], rounds: Transport
    ) -> Iterator[list[FoundKey]]:
        """The keys built from the group's values (as many as the room gave it) and what each
        gives, a page at a time: a queue that is empty (its key gone) still reads 0."""
        group = tally.group
        self._room.fit(choices, tally)
        built = built_keys(
            group, choices, self.config.scan_count, cycle.before.built.get(id(group))
        )
        cycle.learned.built[id(group)] = built
        if isinstance(group, OrderedGroup) and group.look_alikes is not None:
            self._name_look_alikes(tally, built, rounds.client)
        yield from built.pages

    def _name_look_alikes(self, tally: GroupTally, built: BuiltKeys, client: redis.Redis) -> None:
        """Name the keys that look like the group's queues and are not among its keys
        (sources/redis_keys/look_alikes.py): each as unlisted_queue, those left unchecked beyond its max_keys
        as look_alikes_unchecked. A failure to look is counted; the group's keys are read."""
        group, nodes = tally.group, self._nodes
        known = {key for page in built.pages for key, _ in page}
        shards = [client] if nodes is None else [shard for _, shard in nodes.shards()]

        def node_of(key: bytes) -> redis.Redis:
            return client if nodes is None else nodes.node_of(key)[1]

        glob = scan_glob(group.pattern).encode()
        config = self.config
        try:
            found, unchecked = look_alikes(
                group, known, shards, node_of, config.scan_count, config.max_item_bytes, bool(nodes)
            )
        except redis.RedisError as error:
            tally.failed(glob, "look_alikes_unread", redis_error_reason(error))
            return
        for key in found:
            tally.failed(key, "unlisted_queue")
        if unchecked:
            tally.failed(glob, "look_alikes_unchecked", f"{unchecked} key(s)")

    def _values_from_set(
        self, cycle: Cycle, members: SetMembers, tally: GroupTally, rounds: Transport
    ) -> set[str] | None:
        """The values a set's members name; with a key pattern, every matching set's (kombu's
        bindings: one set per exchange). None: the one set is not a set, the group is lost.
        No more than max_keys members are read over the sets, SSCAN (ZSCAN) a page at a time:
        more values than that could not become keys the cycle reads, and a set flooded with
        a million members costs the cycle max_keys (the rest named: too_many_members). Those
        read are the first SSCAN gives (Redis's hash order: the same each cycle while the set
        is unchanged)."""
        pattern = bool(placeholders(members.key))
        keys = self._scanned(cycle, members.key, tally, rounds, 0) if pattern else [members.key]
        limit = self.config.max_keys
        stored: list[bytes] = []
        for key in keys:
            node = rounds.client if self._nodes is None else self._nodes.node_of(key.encode())[1]
            listing = members_of(node, key, members.type)
            try:  # one past the room left tells a set that holds more
                stored += itertools.islice(listing, limit - len(stored) + 1)
            except redis.ResponseError as error:  # not a set: this key (this group) alone is lost
                tally.failed(key.encode(), response_reason(error))
                if not pattern:
                    return None
            if len(stored) > limit:  # named with its size: a count, not a read of the rest
                size = node.zcard(key) if members.type == "zset" else node.scard(key)
                del stored[limit:]
                detail = f"{size} members, {limit} (max_keys) read over the group's sets"
                tally.failed(key.encode(), "too_many_members", detail)
                break
        return member_values(stored, members.member)

    def _scanned(
        self, cycle: Cycle, pattern: str, tally: GroupTally, rounds: Transport, part: str | int
    ) -> list[str]:
        """What a SCAN of `pattern` (its placeholders wildcards) finds: each key that matches
        it (part 0), or the {value} each names (part "value"). One SCAN a cycle per pattern,
        shared by the groups that name it (Celery's two groups, one SCAN of kombu's bindings).
        No more than max_keys keys are taken (more could not become keys the cycle reads, and
        each is remembered for the next cycle); the others are counted and named once a
        cycle (too_many_values)."""

        def find() -> list[str]:
            rounds.flush()  # what is queued is read first: a node lost from here is the SCAN's
            # a key found last cycle names what it did (a regex per key was about 10% of a
            # bull cycle at 10k queues: docs/benchmarks.md)
            regex, last = key_regex(pattern), cycle.before.named.get(name, {})
            named: dict[bytes, str] = {}
            limit, beyond = self.config.max_keys, 0
            for page in self._scan(cycle, scan_glob(pattern), [tally], rounds):
                for key in page:
                    value = last.get(key)
                    if value is None:
                        match = regex.match(text(key))
                        if match is None:
                            continue
                        value = match.group(part)
                    if len(named) < limit or key in named:
                        named[key] = value
                    else:
                        beyond += 1  # a key SCAN returns twice may count twice: a bound
            if beyond:
                detail = f"{beyond} more keys match, {limit} (max_keys) taken"
                tally.failed(pattern.encode(), "too_many_values", detail)
            cycle.learned.named[name] = named
            return sorted(set(named.values()))

        name = f"{part}\n{pattern}"
        found, partial = cycle.once(name, find)
        if partial:  # a node's keys are missing: so are the queues they name
            cycle.lose_group(tally, pattern.encode(), "scanned without a node")
        return found
