"""How the key sampler's commands travel: rounds of at most pipeline_size commands, one round
trip each, on one server or on each node of a Redis Cluster.

The shape is bench/key_sampling.py's floor loop: each round carries the next SCAN and the
reads of the keys the last SCAN page found (and the follow-ups the last replies asked for),
so a cycle takes one round trip per SCAN page, then one for the last follow-ups. On a Redis
Cluster every node runs that loop at once: a round is sent on each node that has work, and
whichever node's replies are in first (SentCommands.first_in) is read and sent its next
round, so no node waits for another. The keys a node's SCAN finds are read on that node;
other commands go to their slot's node (an ASK reply's, to the node it names, after ASKING).
A node that fails loses the groups of the keys it was to read; if no node answered this
cycle, the source is down.

The SCAN a page ahead, the round kept in flight and the per-node machinery this loop replaced
bought no measured speed (docs/benchmarks.md, "One transport shape": 100,000 keys, 1.28x-1.52x
the floor's CPU after, 1.46x-1.50x before).

What the replies mean is the cycle's (key_commands.Cycle): this module only batches, sends,
reads and sorts replies out, and hands them back.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import redis

from exporter.redis.cluster import ClusterNodes
from exporter.redis.pipeline import Args, SentCommands, bounded_reads
from exporter.sources.redis_keys.commands import Cycle, GroupReads, Run
from exporter.sources.redis_keys.types import ASKED, ITEM_READ, Command, FoundKey, key_of

# What a node's SCAN gives the sampler: the keys of one page, or the error the node failed with.
ScanPage = tuple[str, "list[bytes] | redis.RedisError"]


class SentRound:
    """One round trip, sent: its SCAN (if any) first, then its commands (one an ASK reply sent
    to this node after ASKING, which holds for the one command after it), the commands of its
    keys read in bulk, and last one bounded_reads of every item read among them."""

    __slots__ = ("commands", "reads", "runs", "scan", "sent")

    def __init__(
        self,
        cycle: Cycle,
        client: redis.Redis,
        scan: Args | None,
        commands: list[Command],
        runs: list[Run],
    ) -> None:
        self.scan, self.commands, self.runs = scan, commands, runs
        args: list[Args] = [] if scan is None else [scan]
        read_keys: list[bytes] = []
        reads: list[Args] = []
        for head, _, _ in commands:
            if head[0] is ITEM_READ:
                read_keys.append(head[1])
                reads.append(head[2])
            else:
                args += (("ASKING",), head[2]) if head[0] is ASKED else (head,)
        for group, run in runs:
            direct, run_keys, run_reads = group.commands(
                [key for key, _ in run], cycle.before.large_heads
            )
            args += direct
            read_keys += run_keys
            reads += run_reads
        if read_keys:
            limit, any_slot = cycle.max_item_bytes, cycle.nodes is not None
            args.append(bounded_reads(read_keys, reads, limit, any_slot))
        self.reads = len(read_keys)
        self.sent = SentCommands(client, args)

    def handle(self, cycle: Cycle) -> tuple[Any, list[Command]]:
        """Read the replies (raising if the round trip or its SCAN failed) and hand them to
        the cycle: the SCAN's reply, and the follow-up commands the replies ask for."""
        replies = self.sent.replies()
        reads = _each(replies.pop(), self.reads) if self.reads else iter(())
        direct = iter(replies)
        scanned = next(direct) if self.scan is not None else None
        if isinstance(scanned, redis.RedisError):  # SCAN refused
            raise scanned
        commands, ordered = [], []
        for args, on_reply, tally in self.commands:
            if args[0] is ASKED:
                next(direct)  # ASKING's
                args = args[2]  # a failure is the command's own (not asked again and again)
            commands.append((args, on_reply, tally))
            ordered.append(next(reads) if args[0] is ITEM_READ else next(direct))
        follow_ups = list(cycle.handle(commands, ordered))
        return scanned, follow_ups + cycle.handle_runs(self.runs, list(direct), list(reads))


class NodeWork:
    """One server's (or cluster node's) commands and keys waiting to be sent, its next SCAN,
    and its round in flight."""

    __slots__ = ("client", "in_flight", "name", "pending", "runs", "runs_cost", "scan")

    def __init__(self, name: str, client: redis.Redis) -> None:
        self.name, self.client = name, client
        self.pending: list[Command] = []
        self.runs: list[Run] = []  # keys read in bulk
        self.runs_cost = 0  # the commands those keys take
        self.scan: Args | None = None  # the next SCAN to send
        self.in_flight: SentRound | None = None

    def queued(self) -> int:
        return len(self.pending) + self.runs_cost

    def queue(self, commands: Iterable[Command]) -> None:
        self.pending.extend(commands)

    def queue_run(self, group: GroupReads, keys: list[FoundKey]) -> None:
        self.runs.append((group, keys))
        self.runs_cost += group.cost * len(keys)

    def start_scan(self, glob: str, count: int) -> None:
        self.scan = ("SCAN", b"0", "MATCH", glob, "COUNT", count)

    def send(self, cycle: Cycle, size: int) -> None:
        """The next round, if there is anything to send; the SCAN goes along while what waits
        after this round is less than a round."""
        if not (self.queued() or self.scan):
            return
        commands, runs = self.take(size)
        scan, self.scan = (self.scan, None) if self.queued() < size else (None, self.scan)
        self.in_flight = SentRound(cycle, self.client, scan, commands, runs)

    def received(self) -> SentRound:
        """The round in flight, now to be read."""
        sent, self.in_flight = self.in_flight, None
        assert sent is not None
        return sent

    def scanned(self, sent: SentRound, cursor: Any) -> None:
        """Its SCAN page is in: the next one goes with the page's reads."""
        if sent.scan is not None and cursor not in (b"0", 0):
            self.scan = (sent.scan[0], cursor, *sent.scan[2:])

    def abandon(self) -> None:
        if self.in_flight is not None:
            self.in_flight.sent.abandon()
            self.in_flight = None

    def take(self, size: int) -> tuple[list[Command], list[Run]]:
        """The next round's commands and keys: at most `size` commands (at least one key in
        an empty round)."""
        commands, self.pending = self.pending[:size], self.pending[size:]
        room, runs = size - len(commands), list[Run]()
        while self.runs:
            group, keys = self.runs[0]
            fits = min(len(keys), room // group.cost)
            if fits < 1 and (runs or commands):
                break
            fits = max(fits, 1)
            runs.append((group, keys[:fits]))
            room -= group.cost * fits
            self.runs_cost -= group.cost * fits
            if fits < len(keys):
                self.runs[0] = (group, keys[fits:])
                break
            del self.runs[0]
        return commands, runs


class Transport:
    """A cycle's rounds on one server, or on each node of a cluster (`nodes`)."""

    def __init__(
        self, cycle: Cycle, client: redis.Redis, nodes: ClusterNodes | None, size: int
    ) -> None:
        self.cycle, self.nodes, self.size = cycle, nodes, size
        # Each node's work; on one server, its only node's
        self.work = {} if nodes is not None else {"": NodeWork("", client)}
        self.client = client
        self.lost: dict[str, redis.RedisError] = {}  # the cluster nodes that failed this cycle
        self.into: NodeWork | None = None  # the node whose SCAN page's keys are being added

    # -- queueing ------------------------------------------------------------------------------

    def add(self, commands: Iterable[Command]) -> None:
        """Commands to send: on the node whose SCAN page is read (no slot lookup), else each
        on its key's node. Outside a SCAN, full rounds go at once."""
        if self.into is not None:
            self.into.queue(commands)
            return
        self._route(commands)
        self.flush(full_only=True)

    def add_run(self, group: GroupReads, keys: list[FoundKey]) -> None:
        """Keys of one group read in bulk, placed as add() places commands."""
        if self.into is not None or self.nodes is None:
            (self.into or self.work[""]).queue_run(group, keys)
        else:
            by_node: dict[str, list[FoundKey]] = {}
            for found in keys:
                name, client = self.nodes.node_of(found[0])
                node = self._node(name, client)
                if node is None:
                    self.cycle.node_lost(name, [], [(group, [found])], self.lost[name])
                else:
                    by_node.setdefault(name, []).append(found)
            for name, node_keys in by_node.items():
                self.work[name].queue_run(group, node_keys)
        if self.into is None:
            self.flush(full_only=True)

    def _route(self, commands: Iterable[Command]) -> None:
        """Each command on its key's node, or (after an ASK reply) on the node it names."""
        if self.nodes is None:  # one server: no key to look up, no node lost (it raises)
            self.work[""].queue(commands)
            return
        for command in commands:
            args = command[0]
            name, client = args[1] if args[0] is ASKED else self.nodes.node_of(key_of(args))
            node = self._node(name, client)
            if node is None:
                self.cycle.node_lost(name, [command], [], self.lost[name])
            else:
                node.queue([command])

    def _node(self, name: str, client: redis.Redis) -> NodeWork | None:
        """The node's work (None once it failed this cycle)."""
        if name in self.lost:
            return None
        node = self.work.get(name)
        if node is None:
            node = self.work[name] = NodeWork(name, client)
        return node

    # -- running rounds ------------------------------------------------------------------------

    def scan(self, glob: str, count: int) -> Iterator[ScanPage]:
        """SCAN MATCH `glob` on every shard at once: each page of keys as it comes (the
        commands then added are its node's, and go with its next SCAN). A node that fails
        while it is scanned gives its error in place of a page, once."""
        shards = [("", self.client)] if self.nodes is None else self.nodes.shards()
        for name, client in shards:
            node = self._node(name, client)
            if node is None:  # failed earlier this cycle: not asked again
                yield name, self.lost[name]
            else:
                node.start_scan(glob, count)
        yield from self._run(full_only=False)

    def flush(self, full_only: bool = False) -> None:
        """Send everything queued (with `full_only`, full rounds only), and whatever its
        replies ask for, until all is handled."""
        for _ in self._run(full_only):
            pass

    def _run(self, full_only: bool) -> Iterator[ScanPage]:
        """Send each node with work its next round (with `full_only`, only full rounds); read
        whichever node's replies are in first and hand them on; until no round is in flight.
        If nodes failed and none answered this cycle, the first failure is raised."""
        while True:
            for node in list(self.work.values()):
                if node.in_flight is None and (node.queued() >= self.size or not full_only):
                    node.send(self.cycle, self.size)
            waiting = {node.in_flight.sent: node for node in self.work.values() if node.in_flight}
            if not waiting:
                break
            rounds = list(waiting)
            node = waiting[rounds[0] if len(rounds) == 1 else SentCommands.first_in(rounds)]
            sent = node.received()
            try:
                scanned, follow_ups = sent.handle(self.cycle)
            except redis.RedisError as error:
                if self.nodes is None:
                    raise
                self._lose(node, error, sent)
                if sent.scan is not None or node.scan is not None:
                    yield node.name, error  # its scan is cut short
                continue
            if self.nodes is not None:
                self.cycle.answered()
            self._route(follow_ups)
            if sent.scan is not None:
                cursor, keys = scanned
                node.scanned(sent, cursor)
                self.into = node
                try:
                    yield node.name, keys
                finally:
                    self.into = None
        if self.lost and not self.cycle.node_answered:
            raise next(iter(self.lost.values()))

    def _lose(self, node: NodeWork, error: redis.RedisError, sent: SentRound) -> None:
        """A node failed: what it was to read (sent or queued) loses its groups, and so does
        whatever is routed to it later this cycle (its work is dropped)."""
        assert self.nodes is not None
        self.nodes.noticed(error)
        self.lost[node.name] = error
        del self.work[node.name]
        self.cycle.node_lost(node.name, node.pending + sent.commands, sent.runs + node.runs, error)

    def abandon(self) -> None:
        """The cycle failed: no round in flight is read (their connections are dropped)."""
        for node in self.work.values():
            node.abandon()


def _each(reply: Any, count: int) -> Iterator[Any]:
    """The replies of a bounded_reads; if the whole command failed, its error for each read."""
    return iter(reply) if isinstance(reply, list) else itertools.repeat(reply, count)
