"""The Redis key sampler: depth and head-of-queue age of every key that matches a key group.

One cycle: find the keys (one SCAN MATCH shared by the scanned groups while that pays, else
one per group: key_scans.py; or keys built from enumerated values), read them in pipelines of
`pipeline_size` commands (one depth command per key or priority band, one for the head item,
one for the due count: key_commands.py), then one more pipelined round for the items that point
at a hash (RQ jobs, BullMQ jobs) or at a stream position. On one server SCAN runs a page ahead
on a connection of its own, and the reads' rounds go on another (a third takes the follow-up
rounds): Redis works on the next page and the next round while this process parses the last
ones. On a Redis Cluster every shard is scanned at once, each node in a flow of its own (its
SCAN a page ahead there too): the keys its SCAN finds are read on it, and its next round goes
as soon as its own replies are in, never waiting for another node (key_rounds.py).

Each cycle also tallies, per key group, the keys it matched, the series they gave and what
could not be read (key, reason). The tallies go onto the HealthBoard, and problems are logged
at WARNING naming group, key and reason, rate-limited: a typo in a pattern must not look like
an empty queue.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import redis

from exporter.catalog import QUEUE_LABELS, SOURCE_LABEL, SYSTEM_QUEUE, MetricSpec
from exporter.health import KeyGroupReport
from exporter.logs import LogLimiter
from exporter.redis_cluster import ClusterNodes
from exporter.redis_connection import (
    follow_failover,
    redis_error_reason,
    sever,
)
from exporter.redis_pipeline import (
    Args,
    SentCommands,
    bounded_reads,
    probe_first,
)
from exporter.samples import SampleSet
from exporter.sources.key_commands import (
    DEPTH,
    DEPTH_COMMAND,
    END_READS,
    MAX_DEPTH,
    OLDEST_AGE,
    Cycle,
    ItemError,
    exception_reason,
    head_time,
)
from exporter.sources.key_groups import (
    KeyGroup,
    SetMembers,
    fill,
    key_regex,
    literal_prefix,
    scan_glob,
)
from exporter.sources.key_rounds import (
    ASKED,
    ITEM_READ,
    NodeFlows,
    Rounds,
    key_of,
)
from exporter.sources.key_scans import KeyScan, ScanPlan
from exporter.sources.redis_keys_config import RedisSourceConfig
from exporter.telemetry import Telemetry

log = logging.getLogger(__name__)

# How many matched keys and series a KeyGroupReport names as examples.
EXAMPLES = 5

# A group that finds nothing, in plain words: scanned keys vanish when their queue empties
# (Redis deletes an empty list or zset), keys built from values do not.
_NO_KEYS = (
    "matched no keys: a typo in the pattern or the wrong database, or every queue of it is "
    "empty (Redis deletes empty keys)"
)
_NO_KEYS_ENUMERATED = "matched no keys: the values or set that name its queues are empty"

# What each error reason means, for the log and the status page.
REASON_WORDS = {
    "wrong_type": "holds another Redis type than the group's",
    "response_error": "Redis refused the read",
    "item_not_json": "the head item is not JSON",
    "time_missing": "the head item carries no time",
    "time_unparsable": "the head item's time does not parse",
    "item_not_utf8": "the head item names a hash but is not UTF-8",
    "item_too_deep": "the head item is nested too deep to read",
    "item_unreadable": "reading the head item failed",
    "item_too_large": "the head item is larger than max_item_bytes, its time is not read",
    "stream_missing": "the stream does not exist",
    "stream_group_missing": "the stream has no such consumer group",
    "items_unread": "holds more items than split_by.max_items; the rest count as __unread__",
    "label_unreadable": "items without the split_by field count as __unread__",
    "slot_moved": "its cluster slot moved or is not served (MOVED, CLUSTERDOWN, TRYAGAIN, or ASK "
    "to an unknown node): "
    "the group's series are withdrawn this cycle and the slot map is read again",
    "node_down": "the cluster node holding it did not answer: the group's series are withdrawn "
    "this cycle",
}


class GroupTally:
    """What one key group met during one cycle; becomes its KeyGroupReport."""

    def __init__(self, group: KeyGroup, source: str, telemetry: Telemetry, warnings: LogLimiter):
        self.group = group
        self.source = source
        self.telemetry = telemetry
        self.warnings = warnings
        self.keys = 0
        self.example_keys: list[bytes] = []
        self.series: dict[Labels, None] = {}  # a dict: the first ones found are the examples
        self.errors: Counter[str] = Counter()
        self.last_warning: str | None = None
        self._failed: set[tuple[bytes, str]] = set()

    def matched(self, page: list[tuple[bytes, KeyMatch]]) -> None:
        """Count a page of keys the group matched; the first ones are its examples."""
        if self.keys < EXAMPLES:
            self.example_keys += [key for key, _ in page[: EXAMPLES - self.keys]]
        self.keys += len(page)

    def failed(self, key: bytes, reason: str, detail: str = "") -> None:
        """Count and name a key the group could not read (rate-limited per group and reason).

        Once per key and reason in a cycle: a zset in a list group fails both its LLEN and its
        LINDEX, and that is one key of the wrong type."""
        if (key, reason) in self._failed:
            return
        self._failed.add((key, reason))
        self.errors[reason] += 1
        group = self.group
        self.telemetry.count_error(self.source, reason, system=group.system, pattern=group.pattern)
        words = REASON_WORDS.get(reason, reason) + (f" ({detail})" if detail else "")
        self.warn(reason, f"key {_text(key)[:200]!r}: {words}")

    def warn(self, reason: str, problem: str) -> None:
        group = self.group
        self.last_warning = problem
        self.warnings.warning(
            (group.pattern, reason),
            "key group %r (system %s, %s): %s [%s]",
            group.pattern,
            group.system,
            group.type,
            problem,
            reason,
        )

    def report(self) -> KeyGroupReport:
        group = self.group
        return KeyGroupReport(
            source=self.source,
            system=group.system,
            pattern=group.pattern,
            type=group.type,
            keys_matched=self.keys,
            queues=len({labels.queue for labels in self.series}),
            series=len(self.series),
            errors=dict(self.errors),
            last_warning=self.last_warning,
            example_keys=tuple(_text(key) for key in self.example_keys),
            example_series=tuple(itertools.islice(self.series, EXAMPLES)),
        )


# A cluster node's error for a read its script made of a key that is not there: in a migrating
# slot, a key already moved (the node would answer a command of its own with ASK).
_NOT_LOCAL = "ERR Script attempted to access a non local key"


OnReply = Callable[[Any], "Command | None"]
# A command to pipeline, what its reply means (possibly a follow-up command) and the key group
# it reads for. A plain tuple: a cycle builds one or two per key, so construction cost matters
# at 100k keys.
Command = tuple[tuple[Any, ...], OnReply, GroupTally]


class Labels(NamedTuple):
    """A queue series' labels, in catalog.QUEUE_LABELS order (so the tuple is the series key)."""

    system: str
    queue: str
    priority: str
    state: str

    def for_metric(self, spec: MetricSpec) -> tuple[str, ...]:
        return self if spec.labels == QUEUE_LABELS else (self.system, self.queue)


class KeyMatch(NamedTuple):
    """What a key gives: its placeholders' values and its series' labels."""

    captured: dict[str, str]
    labels: Labels


# The key groups (positions among a SCAN's groups) that take a key, and what it gives each.
Route = tuple[tuple[int, KeyMatch], ...]


def labels_for(group: KeyGroup, captured: dict[str, str]) -> Labels:
    return Labels(
        group.system,
        captured.get("queue") or group.labels.get("queue", ""),
        captured.get("priority") or group.labels.get("priority", ""),
        group.state,
    )


# Labels doubles as the series key, and for_metric() knows only these two label sets.
if Labels._fields != QUEUE_LABELS:
    raise RuntimeError(f"redis_keys.Labels {Labels._fields} differ from catalog {QUEUE_LABELS}")
if any(spec.labels not in (QUEUE_LABELS, SYSTEM_QUEUE) for spec in (DEPTH, OLDEST_AGE, MAX_DEPTH)):
    raise RuntimeError("redis_keys: a sampled family has labels for_metric() cannot build")
# _handle_plain combines samples inline: depths add up, ages and limits keep the largest.
if (DEPTH.combine, OLDEST_AGE.combine, MAX_DEPTH.combine) != ("sum", "max", "max"):
    raise RuntimeError("redis_keys: _handle_plain combines a sampled family the wrong way")
# Below any age or limit: what a series not yet in a table compares as, when keeping the largest.
_LEAST = float("-inf")


def redis_samplers(
    redis: RedisSourceConfig | list[RedisSourceConfig] | None,
    telemetry: Telemetry,
    default_interval: float,
) -> list[RedisKeySampler]:
    """A key sampler per Redis with key groups. Several Redis sources are each named
    redis:<name> and their series carry redis_source="<name>"; one alone is plain "redis",
    its series as they always were."""
    if not isinstance(redis, list):
        one = [redis] if redis is not None and redis.key_groups else []
        return [RedisKeySampler(config, telemetry, default_interval) for config in one]
    return [
        RedisKeySampler(config, telemetry, default_interval, source_label=config.name)
        for config in redis
        if config.key_groups
    ]


class RedisKeySampler:
    def __init__(
        self,
        config: RedisSourceConfig,
        telemetry: Telemetry,
        default_interval: float,
        source_label: str | None = None,
    ) -> None:
        self.name = "redis" if source_label is None else f"redis:{source_label}"
        self.source_label = source_label
        self.config = config
        self.interval = config.sample_interval or default_interval
        self.deadline = config.cycle_timeout or self.interval
        self.telemetry = telemetry
        self._client: redis.Redis | None = None
        self._regexes = {group.pattern: key_regex(group.pattern) for group in config.key_groups}
        # A key not starting with a pattern's literal prefix is not the pattern's: a shared
        # SCAN's keys of other groups, and of none, are told apart without a regex
        self._prefixes = {
            group.pattern: literal_prefix(group.pattern).encode() for group in config.key_groups
        }
        self._warnings = LogLimiter(log)
        # Keys whose head was too large last cycle, and this cycle: their head is probed first
        # (probe_first), so a stuck huge item is not copied inside Redis every cycle.
        self._large_heads: set[bytes] = set()
        self._large_heads_now: set[bytes] = set()
        self._reported_once = False
        # values_from_keys patterns scanned this cycle: BullMQ's groups share one SCAN of meta keys
        self._values_found: dict[str, list[str]] = {}
        # A Redis Cluster's nodes (redis+cluster:// URLs), and the groups that lost a node's
        # keys this cycle: their series are withdrawn, never served partly summed.
        self._nodes: ClusterNodes | None = None
        self._lost_groups: set[int] = set()
        self._node_answered = False  # some cluster node answered this cycle: the source is up
        self._partial_values: set[str] = set()  # values_from_keys scanned without some node
        # The SCANs of each cycle: one shared by the scanned groups while that pays, or one each
        self._scan_plan = ScanPlan(self.name, config.key_groups, config.scan_count)
        # Per SCAN (by its groups), which groups took each key it found last cycle, and what
        # the key gave them: the same keys come back every cycle, and matching each against
        # the patterns' regexes again cost more than reading it.
        self._known: dict[tuple[int, ...], dict[bytes, Route]] = {}

    # -- Source protocol -------------------------------------------------------------------

    def sample(self) -> SampleSet:
        client = self._connect()
        follow_failover(client)  # behind Sentinel: this cycle reads the master of now
        if self._nodes is not None:
            self._nodes.refresh_if_moved()
        self._values_found = {}
        self._partial_values = set()
        self._lost_groups = set()
        self._node_answered = False
        cycle = Cycle(time.time(), SampleSet(), self._large_heads)
        self._large_heads_now = set()
        # Commands stream through in pipeline-sized rounds while SCAN goes on, so a cycle holds
        # one round of commands at a time, however large the keyspace.
        follow_ups = self._rounds(client, None)
        rounds = self._rounds(client, follow_ups)
        try:
            tallies = self._sample_groups(client, cycle, rounds, follow_ups)
        finally:  # a cycle that failed leaves no reply unread on a connection
            rounds.abandon()
            follow_ups.abandon()
        self._large_heads = self._large_heads_now
        self._withdraw_lost_groups(cycle.samples, tallies)
        self._report(tallies)
        if self.source_label is not None:
            return cycle.samples.with_label(SOURCE_LABEL, self.source_label)
        return cycle.samples

    def _sample_groups(
        self,
        client: redis.Redis,
        cycle: Cycle,
        rounds: Rounds | NodeFlows,
        follow_ups: Rounds | NodeFlows,
    ) -> list[GroupTally]:
        """Find and read every key group's keys; their tallies."""
        tallies = [
            GroupTally(group, self.name, self.telemetry, self._warnings)
            for group in self.config.key_groups
        ]
        plains = {id(t): _PlainGroup(t, cycle) for t in tallies if _PlainGroup.suits(t.group)}

        def read(tally: GroupTally, page: list[tuple[bytes, KeyMatch]]) -> None:
            tally.matched(page)
            plain = plains.get(id(tally))
            if plain is not None:
                rounds.add_plain(plain, [(plain, key, match.labels) for key, match in page])
                return
            for key, match in page:
                rounds.extend(cycle.commands_for_key(tally, key, *match))

        known, self._known = self._known, {}
        for scan in self._scan_plan.scans():
            members = [tallies[index] for index in scan.groups]
            last_cycle = known.get(scan.groups, {})
            for tally, page in self._scanned_pages(client, scan, members, rounds, last_cycle):
                read(tally, page)
        for tally in (tally for tally in tallies if tally.group.enumerated):
            for page in self._enumerated_pages(client, tally):
                read(tally, page)
        rounds.flush()
        follow_ups.flush()
        return tallies

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

    def _withdraw_lost_groups(self, samples: SampleSet, tallies: list[GroupTally]) -> None:
        """A group some of whose keys sat on a cluster node that did not answer: its series
        would be partial sums, so none of them is served this cycle."""
        for tally in (tally for tally in tallies if id(tally) in self._lost_groups):
            for spec in (DEPTH, OLDEST_AGE):
                samples.discard(spec, tally.series)
            tally.series.clear()

    def _report(self, tallies: list[GroupTally]) -> None:
        """Put the cycle's findings on the HealthBoard; the first cycle's also in the log."""
        for tally in tallies:
            if tally.keys == 0:
                tally.warn("no_keys", _NO_KEYS_ENUMERATED if tally.group.enumerated else _NO_KEYS)
        level = logging.DEBUG if self._reported_once else logging.INFO
        self._reported_once = True
        reports = [tally.report() for tally in tallies]  # its queues counted once, for both
        for report in reports:
            log.log(
                level,
                "key group %r (system %s, %s): %d key(s) matched, %d queue(s), %d series%s",
                report.pattern,
                report.system,
                report.type,
                report.keys_matched,
                report.queues,
                report.series,
                f", errors {report.errors}" if report.errors else "",
            )
        self.telemetry.health.report_key_groups(self.name, reports)

    # -- finding keys and running commands ------------------------------------------------------

    def _connect(self) -> redis.Redis:
        if self._nodes is not None:
            return self._nodes.primaries()[0][1]
        if self._client is None:
            if self.config.is_cluster:
                replicas = self.config.read_from == "replica"
                self._nodes = ClusterNodes(self.config.connect_cluster(replicas), replicas)
                return self._nodes.primaries()[0][1]  # commands go by key: see _client_for
            self._client = self.config.connect(replica=self.config.read_from == "replica")
        return self._client

    def _client_for(self, client: redis.Redis, key: str) -> redis.Redis:
        """The client for a single-key command: on a cluster, the node of the key's slot."""
        return self._nodes.node_of(key.encode())[1] if self._nodes is not None else client

    def _scan(
        self,
        client: redis.Redis,
        glob: str,
        tallies: list[GroupTally],
        rounds: Rounds | NodeFlows | None = None,
    ) -> Iterator[list[bytes]]:
        """The keys SCAN MATCH `glob` finds for the groups, a page at a time (a SCAN reply's;
        on a cluster a node's): a page's keys are matched and queued in one loop, not a
        generator step each."""
        count = self.config.scan_count
        if self._nodes is not None:
            flows = rounds if rounds is not None else self._rounds(client, None)
            assert isinstance(flows, NodeFlows)
            return self._scan_nodes(self._nodes, glob, tallies, flows)
        return _scan_ahead(client, glob, count)

    def _scan_nodes(
        self, nodes: ClusterNodes, glob: str, tallies: list[GroupTally], flows: NodeFlows
    ) -> Iterator[list[bytes]]:
        """SCAN on every shard at once (each holds its own slots' keys), each node's pages
        read on that node as they come, whatever the others do (NodeFlows). A node that does
        not answer loses the groups their keys: withdrawn this cycle, unless no node answered."""
        shards = nodes.shards()
        failed = 0
        for name, page in flows.scan(shards, glob, self.config.scan_count):
            if isinstance(page, redis.RedisError):
                failed += 1
                if failed == len(shards) and not self._node_answered:
                    raise page
                detail = f"node {name}: {redis_error_reason(page)}"
                for tally in tallies:
                    self._lose_group(tally, glob.encode(), detail)
                continue
            yield page  # while flows.into is its node: the keys' reads go there

    def _lose_group(
        self, tally: GroupTally, key: bytes, detail: str, reason: str = "node_down"
    ) -> None:
        if id(tally) not in self._lost_groups:
            self._lost_groups.add(id(tally))
            tally.failed(key, reason, detail)

    def _scanned_pages(
        self,
        client: redis.Redis,
        scan: KeyScan,
        tallies: list[GroupTally],
        rounds: Rounds | NodeFlows,
        last_cycle: dict[bytes, Route],
    ) -> Iterator[tuple[GroupTally, list[tuple[bytes, KeyMatch]]]]:
        """The keys one SCAN finds, each group's with what each gives, a page at a time."""
        # this cycle's keys, which also tells a key seen already: SCAN may return one twice
        routes: dict[bytes, Route] = {}
        self._known[scan.groups] = routes
        unclaimed = 0  # keys no group took: not kept, a shared SCAN may return many
        prefixes = tuple(self._prefixes[tally.group.pattern] for tally in tallies)
        for keys in self._scan(client, scan.glob, tallies, rounds):
            pages: list[list[tuple[bytes, KeyMatch]]] = [[] for _ in tallies]
            for key in keys:
                if key in routes:
                    continue
                route = last_cycle.get(key)
                if route is None:
                    route = self._route(key, tallies) if key.startswith(prefixes) else ()
                    if not route:
                        unclaimed += 1
                        continue
                routes[key] = route
                for index, match in route:
                    pages[index].append((key, match))
            for tally, page in zip(tallies, pages, strict=True):
                if page:
                    yield tally, page
        if len(tallies) > 1:
            self._scan_plan.shared_scan_found(scan, len(routes), unclaimed)

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
                route.append((index, KeyMatch(captured, labels_for(tally.group, captured))))
        return tuple(route)

    def _enumerated_pages(
        self, client: redis.Redis, tally: GroupTally
    ) -> Iterator[list[tuple[bytes, KeyMatch]]]:
        """The keys built from the group's values and what each gives, a page at a time."""
        group = tally.group
        built = self._enumerated_keys(client, tally)
        while values := list(itertools.islice(built, self.config.scan_count)):
            yield [(key, KeyMatch(found, labels_for(group, found))) for key, found in values]

    def _enumerated_keys(
        self, client: redis.Redis, tally: GroupTally
    ) -> Iterator[tuple[bytes, dict[str, str]]]:
        """Keys built from known values: a queue that is empty (its key gone) still reads 0."""
        group = tally.group
        choices = {name: list(values) for name, values in group.values.items()}
        for name, members in group.values_from_set.items():
            try:
                stored = self._members(self._client_for(client, members.key), members)
            except redis.ResponseError as error:  # not a set (any more): this group alone is lost
                tally.failed(members.key.encode(), _response_reason(error))
                return
            member_regex = key_regex(members.member)
            matches = (member_regex.match(_text(member)) for member in stored)
            found = {match.group("value") for match in matches if match}
            choices[name] = sorted(found.union(choices.get(name, [])))
        for name, pattern in group.values_from_keys.items():
            found = set(self._values_from_keys(client, pattern, tally))
            choices[name] = sorted(found.union(choices.get(name, [])))
        for name, regex in group.values_exclude.items():
            excluded = re.compile(regex)
            choices[name] = [value for value in choices[name] if not excluded.fullmatch(value)]
        names = list(choices)
        for combination in itertools.product(*(choices[name] for name in names)):
            captured = dict(zip(names, combination, strict=True))
            yield fill(group.pattern, captured).encode(), captured

    @staticmethod
    def _members(client: redis.Redis, members: SetMembers) -> list[Any]:
        if members.type == "zset":
            return list(client.zrange(members.key, 0, -1))
        return list(client.smembers(members.key))

    def _values_from_keys(self, client: redis.Redis, pattern: str, tally: GroupTally) -> list[str]:
        if pattern not in self._values_found:
            regex = key_regex(pattern)
            lost = len(self._lost_groups)
            found = self._scan(client, scan_glob(pattern), [tally])
            matches = (regex.match(_text(key)) for page in found for key in page)
            self._values_found[pattern] = sorted(
                {match.group("value") for match in matches if match}
            )
            if len(self._lost_groups) > lost:
                self._partial_values.add(pattern)
        if pattern in self._partial_values:  # a node's values are missing: so are its queues
            self._lose_group(tally, pattern.encode(), "values scanned without a node")
        return self._values_found[pattern]

    def _rounds(
        self, client: redis.Redis, follow_ups: Rounds | NodeFlows | None
    ) -> Rounds | NodeFlows:
        """Rounds to send commands in (on a cluster, a flow per node), their follow-ups to
        `follow_ups` (if given).

        A reply that cannot be read fails only what it is about, whatever it raises: the item
        or key is counted and named, and the rest of the cycle goes on. Only a round trip
        itself (the backend) can fail the cycle; on a cluster, a node's round trip fails only
        the groups of the keys it holds, unless no node answered.
        """
        size = self.config.pipeline_size
        if self._nodes is not None:
            assert follow_ups is None or isinstance(follow_ups, NodeFlows)
            return NodeFlows(self, self._nodes, size, follow_ups)
        assert follow_ups is None or isinstance(follow_ups, Rounds)
        return Rounds(self, client, size, follow_ups)

    def _round_commands(
        self, commands: list[Command], leading: Args | None, plain: list[PlainKey]
    ) -> tuple[list[Args], int]:
        """What a round sends, and how many item reads its bounded_reads holds."""
        direct = [] if leading is None else [leading]
        direct += [args for args, _, _ in commands if args[0] is not ITEM_READ]
        reads = [args for args, _, _ in commands if args[0] is ITEM_READ]
        keys = [key for _, key, _ in reads]
        read_args = [read for _, _, read in reads]
        direct += [(group.depth_command, key) for group, key, _ in plain]
        large_heads = self._large_heads
        for group, key, _ in plain:
            if group.read is not None:
                keys.append(key)
                read_args.append(group.probe_read if key in large_heads else group.read)
        if keys:
            limit, any_slot = self.config.max_item_bytes, self._nodes is not None
            direct.append(bounded_reads(keys, read_args, limit, any_slot))
        return direct, len(keys)

    def _redirect(
        self, nodes: ClusterNodes, command: Command, reply: redis.ResponseError
    ) -> Command | None:
        """A key whose slot is migrating and that has already moved: the command its node
        answered with ASK, to the node the reply names (sent after ASKING); an item read the
        node's script could not make, again on its own with its key declared (so that it meets
        that ASK); a command read where SCAN found its key and MOVED from there to the node the
        slot map already names (the key sits on the node importing its slot), again to that
        node. None for any other error."""
        args, on_reply, tally = command
        if nodes.moved_to_its_node(reply, key_of(args)):
            return command  # a follow-up: routed by slot
        if args[0] is ITEM_READ:
            if not str(reply).startswith(_NOT_LOCAL):
                return None
            _, key, read = args
            declared = bounded_reads([key], [read], self.config.max_item_bytes)
            return declared, _one_read(on_reply), tally
        target = nodes.asked(reply)
        return None if target is None else ((ASKED, target, args), on_reply, tally)

    def _node_lost(
        self, node: str, commands: list[Command], plain: list[PlainKey], error: redis.RedisError
    ) -> None:
        detail = f"node {node}: {redis_error_reason(error)}"
        for args, _, tally in commands:
            self._lose_group(tally, key_of(args), detail)
        for group, key, _ in plain:
            self._lose_group(group.tally, key, detail)

    def _handle(self, commands: list[Command], replies: list[Any]) -> Iterator[Command]:
        for command, reply in zip(commands, replies, strict=True):
            args, on_reply, tally = command
            if args[0] is ITEM_READ and type(reply) is int:  # its size: over the limit, in Redis
                self._too_large(tally, args[1], reply)
                continue
            if isinstance(reply, redis.ResponseError):
                redirect = (
                    None if self._nodes is None else self._redirect(self._nodes, command, reply)
                )
                if redirect is not None:
                    yield redirect
                    continue
                reason = _response_reason(reply)
                if self._nodes is not None and self._nodes.noticed(reply):
                    # the key is served elsewhere now: its series would be a partial sum
                    self._lose_group(tally, key_of(args), str(reply)[:80], reason)
                else:
                    tally.failed(key_of(args), reason)
                continue
            try:
                follow_up = on_reply(reply)
            except Exception as error:  # hostile data may raise anything
                _unreadable(tally, key_of(args), error)
                continue
            if follow_up is not None:
                yield follow_up

    def _too_large(self, tally: GroupTally, key: bytes, size: int) -> None:
        """An item over max_item_bytes, measured in Redis: its head is probed next cycle."""
        self._large_heads_now.add(key)
        tally.failed(key, "item_too_large", f"{size} bytes")

    def _handle_plain(
        self, keys: list[PlainKey], depths: list[Any], heads: list[Any]
    ) -> list[Command]:
        """The replies of plain groups' keys (see _PlainGroup): each key's depth, then its
        head's age, failing alone as in _handle. On a cluster a key whose depth read failed is
        read again the general way (returned), which follows ASK and withdraws on MOVED.

        Samples go straight into the tables, combined as their specs say (depths add up, ages
        and limits keep the largest: checked where this module is loaded), without a call per
        sample: this loop runs once per key."""
        again: list[Command] = []
        heads_left = iter(heads)
        group: _PlainGroup | None = None
        for (key_group, key, labels), depth in zip(keys, depths, strict=True):
            if key_group is not group:  # a round's keys are mostly of one group: its locals
                group = key_group
                tally, read_time, max_depth = group.tally, group.head_time, group.max_depth
                samples, now, series = group.cycle.samples, group.cycle.now, tally.series
                depth_table, age_table = samples.table(DEPTH), samples.table(OLDEST_AGE)
                max_table = samples.table(MAX_DEPTH)
                depth_of, age_of, max_of = depth_table.get, age_table.get, max_table.get
            if max_depth is not None:
                queue = labels[:2]  # (system, queue)
                if not max_of(queue, _LEAST) >= max_depth:
                    max_table[queue] = max_depth
            if isinstance(depth, redis.ResponseError):
                if self._nodes is not None:  # the key's head read failed alike, if it has one
                    again += group.cycle.commands_for_key(tally, key, {}, labels)
                    if read_time is not None:
                        next(heads_left)
                    continue
                tally.failed(key, _response_reason(depth))
            else:
                depth_table[labels] = depth_of(labels, 0.0) + float(depth)
                series[labels] = None
            if read_time is None:
                continue
            head = next(heads_left)
            if type(head) is int:  # its size: over the limit, in Redis
                self._too_large(tally, key, head)
                continue
            if isinstance(head, redis.ResponseError):
                tally.failed(key, _response_reason(head))
                continue
            try:
                head_at = read_time(head)
            except Exception as error:  # hostile data may raise anything
                _unreadable(tally, key, error)
                continue
            if head_at is None:  # the queue is empty
                continue
            age = now - head_at
            if not age > 0.0:  # a time ahead of this clock is no wait (as max(0.0, age))
                age = 0.0
            if not age_of(labels, _LEAST) >= age:
                age_table[labels] = age
        return again


class _PlainGroup:
    """A key group read in bulk: per key a depth command and, for a list or zset, the read of
    its head or tail item, whose time is in the item or its score. No follow-up read (hash
    times), no bands, split, due count or stream: those take the general path of a Command
    per read, a reply handler each (Cycle). The plain keys of a round travel as a run of
    depth commands and a run of item reads, their replies consumed in one loop
    (RedisKeySampler._handle_plain) instead of a tuple, two closures and a handler call per
    key: a 100k-key orchestrata cycle cost 2.4x the CPU of bench/key_sampling.py's floor (this
    process and Redis) the general way, 1.4x this way (docs/benchmarks.md). Its keys' series,
    failures and reports are those the general path gives (tests/test_key_sampling_rounds.py)."""

    __slots__ = (
        "cost",
        "cycle",
        "depth_command",
        "head_time",
        "max_depth",
        "oldest",
        "probe_read",
        "read",
        "tally",
    )

    def __init__(self, tally: GroupTally, cycle: Cycle) -> None:
        group = tally.group
        self.tally, self.cycle, self.max_depth = tally, cycle, group.max_depth
        self.depth_command = DEPTH_COMMAND[group.type]
        self.oldest = group.oldest if group.type in ("list", "zset") else None
        self.read: Args | None = None
        self.probe_read: Args | None = None
        self.head_time: Callable[[Any], float | None] | None = None
        if self.oldest is not None:
            self.head_time = head_time(self.oldest)
            self.read = END_READS[group.type, self.oldest.end]
            # a head found too large last cycle is probed before it is copied (probe_first)
            self.probe_read = probe_first(self.read) if self.oldest.end == "head" else self.read
        self.cost = 1 if self.read is None else 2

    @staticmethod
    def suits(group: KeyGroup) -> bool:
        return (
            group.type != "stream"
            and group.priority_bands is None
            and group.split_by is None
            and group.due is None
            and group.scores is None
            and (group.oldest is None or group.oldest.time_in != "hash")
        )


# A plain group's key to read: its group, the key, its series' labels.
PlainKey = tuple[_PlainGroup, bytes, Labels]


def _scan_ahead(client: redis.Redis, glob: str, count: int) -> Iterator[list[bytes]]:
    """SCAN MATCH, a reply's page of keys at a time, the next SCAN sent before the page is
    handed on, on a connection of its own: Redis works on it while this process matches the
    page's keys and reads them (the reads' rounds go on another connection), so neither waits
    for the other between pages. A cluster's nodes do the same in NodeFlows.scanners."""
    sent = SentCommands(client, [("SCAN", b"0", "MATCH", glob, "COUNT", count)])
    try:
        while True:
            reply = sent.replies()[0]
            if isinstance(reply, Exception):
                raise reply
            cursor, keys = reply
            if cursor not in (b"0", 0):
                sent = SentCommands(client, [("SCAN", cursor, "MATCH", glob, "COUNT", count)])
            yield keys
            if cursor in (b"0", 0):
                return
    finally:
        sent.abandon()  # the cycle failed mid-scan: its connection is dropped


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _unreadable(tally: GroupTally, key: bytes, error: Exception) -> None:
    """Count and name a read whose reply handler raised (hostile data)."""
    reason = exception_reason(error)
    tally.failed(key, reason, type(error).__name__ if reason == "item_unreadable" else "")


def _one_read(on_reply: OnReply) -> OnReply:
    """The handler of a bounded_reads of one read, from that read's handler."""

    def on_replies(replies: Any) -> Command | None:
        reply = replies[0]
        if type(reply) is int:  # its size: over max_item_bytes, left in Redis
            raise ItemError("item_too_large")
        if isinstance(reply, redis.ResponseError):
            raise ItemError(_response_reason(reply))
        return on_reply(reply)

    return on_replies


def _response_reason(error: redis.ResponseError) -> str:
    message = str(error)
    if message.startswith("WRONGTYPE"):
        return "wrong_type"
    if message.startswith(("MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN")):
        return "slot_moved"
    if message.removeprefix("ERR ").startswith("no such key"):  # XINFO GROUPS, no stream
        return "stream_missing"
    return "response_error"
