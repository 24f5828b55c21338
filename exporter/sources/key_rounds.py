"""The round machinery of the Redis key sampler: commands sent a pipeline_size round at a time.

A round is one round trip. On one server (Rounds) a round stays in flight while this process
goes on, and each round is sent before the previous one's replies are handled, so Redis works on
it while this process parses those. On a Redis Cluster (NodeFlows) each node has rounds of its
own, and a node's next round goes out as soon as its own replies are in, whatever the other
nodes are doing: the nodes never wait for one another, and this process parses one node's
replies while the others work. Each node's SCAN goes a page ahead of its reads, in rounds of
its own on another connection. The keys a node's SCAN finds are read on that node; other
commands go to their slot's node. A node that fails loses the groups of the keys it was to
read; if no node answered this cycle, the source is down.

What the replies mean is the cycle's (RoundSampler, key_commands.Cycle): these classes only batch, send, read and
sort replies out, and hand them back to it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple, Protocol

import redis

from exporter.redis_cluster import ClusterNodes
from exporter.redis_pipeline import Args, SentCommands
from exporter.sources.key_commands import PlainGroup, PlainKey
from exporter.sources.key_types import ASKED, ITEM_READ, Command, key_of


class RoundSampler(Protocol):
    """What a sent round asks of the cycle (key_commands.Cycle): what its commands send, how
    its replies are handled, and who hears of a cluster node lost."""

    @property
    def node_answered(self) -> bool: ...  # some cluster node answered this cycle: it is up

    def answered(self) -> None: ...  # a cluster node answered a round

    def round_commands(
        self, commands: list[Command], leading: Args | None, plain: list[PlainKey]
    ) -> tuple[list[Args], int]: ...

    def handle(self, commands: list[Command], replies: list[Any]) -> Iterator[Command]: ...

    def handle_plain(
        self, keys: list[PlainKey], depths: list[Any], heads: list[Any]
    ) -> list[Command]: ...

    def node_lost(
        self, node: str, commands: list[Command], plain: list[PlainKey], error: redis.RedisError
    ) -> None: ...


class _Replies(NamedTuple):
    """One round's replies: the leading command's, the commands' in order, and the plain
    keys' depths and item reads."""

    leading: Any
    replies: list[Any]
    depths: list[Any]
    heads: list[Any]


class SentRound:
    """One round trip on one server (or cluster node), sent: its replies read by receive(),
    then handled by handle() once the next round is sent. Commands an ASK reply sent to the
    node importing their slot (`asked`) go each after ASKING, which holds for the one command
    after it."""

    __slots__ = ("commands", "leading", "plain", "reads", "replies", "sampler", "sent")

    def __init__(
        self,
        sampler: RoundSampler,
        client: redis.Redis,
        commands: list[Command],
        leading: Args | None,
        plain: list[PlainKey],
        asked: bool = False,
    ) -> None:
        self.sampler, self.leading, self.plain = sampler, leading, plain
        self.replies: _Replies | None = None
        if asked:  # the replies are those of the commands the ASKED marks wrap
            self.commands = [(args[2], on_reply, tally) for args, on_reply, tally in commands]
            direct = [part for args, _, _ in self.commands for part in (("ASKING",), args)]
            self.reads = -1
        else:
            self.commands = commands
            direct, self.reads = sampler.round_commands(commands, leading, plain)
        self.sent = SentCommands(client, direct)

    def receive(self) -> Any:
        """Read the replies; the leading command's is returned."""
        replies = self.sent.replies()
        if self.reads < 0:  # after ASKING: every other reply
            replies, self.reads = replies[1::2], 0
        self.replies = _round_replies(self.commands, self.leading, replies, self.reads)
        return self.replies.leading

    def handle(self) -> list[Command]:
        """Handle the replies read; the follow-up commands they ask for."""
        replies, sampler = self.replies, self.sampler
        assert replies is not None
        follow_ups = list(sampler.handle(self.commands, replies.replies))
        return follow_ups + sampler.handle_plain(self.plain, replies.depths, replies.heads)


def _round_replies(
    commands: list[Command], leading: Args | None, replies: list[Any], reads: int
) -> _Replies:
    """A round trip's replies (RoundSampler.round_commands) sorted out: the leading
    command's, the commands' in order, the plain keys' depths and item reads."""
    read_replies = _each(replies.pop(), reads) if reads else iter(())
    direct_replies = iter(replies)
    leading_reply = None if leading is None else next(direct_replies)
    ordered = [
        next(read_replies) if args[0] is ITEM_READ else next(direct_replies)
        for args, _, _ in commands
    ]
    return _Replies(leading_reply, ordered, list(direct_replies), list(read_replies))


class Rounds:
    """Collects commands for one server (or cluster node) and sends them a pipeline_size round
    at a time; each round's follow-ups go to `follow_ups` (without: to these rounds)."""

    def __init__(
        self,
        sampler: RoundSampler,
        client: redis.Redis,
        size: int,
        follow_ups: Rounds | NodeFlows | None,
        asked: bool = False,
    ) -> None:
        self.sampler, self.client, self.asked = sampler, client, asked
        self.follow_ups = follow_ups
        self.size = size
        self.pending: list[Command] = []
        self.plain: list[PlainKey] = []
        self.plain_cost = 0  # the commands the plain keys take: one or two each
        self.in_flight: SentRound | None = None  # sent, not yet read
        self.unhandled: SentRound | None = None  # read, not yet handled

    def extend(self, commands: Iterable[Command]) -> None:
        self.queue(commands)
        self._flush_if_full()

    def queue(self, commands: Iterable[Command]) -> None:
        """Add commands to the next rounds, sending nothing yet."""
        self.pending.extend(commands)

    def add_plain(self, group: PlainGroup, keys: list[PlainKey]) -> None:
        """Keys of one plain group (a page of them), sent once rounds fill."""
        self.queue_plain(group, keys)
        self._flush_if_full()

    def queue_plain(self, group: PlainGroup, keys: list[PlainKey]) -> None:
        """Add keys of one plain group to the next rounds, sending nothing yet."""
        self.plain += keys
        self.plain_cost += group.cost * len(keys)

    def queued(self) -> int:
        """How many commands wait to be sent."""
        return len(self.pending) + self.plain_cost

    def _flush_if_full(self) -> None:
        """Send each full round: one round stays in flight, so Redis works on it while this
        process goes on (finding keys, queueing commands)."""
        while self.queued() >= self.size:
            self._step()

    def flush(self) -> None:
        """Send every pending command a round at a time and read and handle every reply. Each
        round's replies are handled once the next round is sent."""
        while self.in_flight or self.pending or self.plain or self.unhandled:
            self._step()

    def _step(self) -> None:
        """Read the round in flight, if any, then send the next one (handling the one read)."""
        if self.in_flight is not None:
            self.receive()
        self.send()

    def send(self, leading: Args | None = None) -> bool:
        """Send the next round (`leading` first in it), then handle the replies of the round
        read last while Redis works on this one. With nothing to send, only that round is
        handled (which may queue follow-ups) and False returned."""
        if not (self.pending or self.plain or leading is not None):
            self._handle_unhandled()
            return False
        batch, self.pending = self.pending[: self.size], self.pending[self.size :]
        plain = self._take_plain(self.size - len(batch))
        self.in_flight = SentRound(self.sampler, self.client, batch, leading, plain, self.asked)
        self._handle_unhandled()
        return True

    def receive(self) -> Any:
        """Read the round sent last; its leading command's reply is returned."""
        sent, self.in_flight = self.in_flight, None
        assert sent is not None
        reply = sent.receive()
        self.unhandled = sent
        return reply

    def abandon(self) -> None:
        """The cycle failed: the round in flight is not read (its connection is dropped)."""
        if self.in_flight is not None:
            self.in_flight.sent.abandon()
            self.in_flight = None

    def drop(self) -> tuple[list[Command], list[PlainKey]]:
        """Its server failed: what it was to read (in flight, its reply abandoned, and
        queued), taken out of these rounds."""
        commands, plain = [], []
        if self.in_flight is not None:
            commands, plain = list(self.in_flight.commands), list(self.in_flight.plain)
            self.abandon()
        commands += self.pending
        plain += self.plain
        self.pending, self.plain, self.plain_cost = [], [], 0
        return commands, plain

    def _handle_unhandled(self) -> None:
        """Handle the replies of the round read last; its follow-ups go to the follow-up
        rounds, or (a follow-up's own: a redirected read's hash read) to these."""
        if self.unhandled is None:
            return
        follow_ups, self.unhandled = self.unhandled.handle(), None
        if self.follow_ups is not None:
            self.follow_ups.extend(follow_ups)
        else:
            self.pending.extend(follow_ups)

    def _take_plain(self, room: int) -> list[PlainKey]:
        """The plain keys whose commands fit in `room` (at least one key in an empty round)."""
        taken = cost = 0
        for group, _, _ in self.plain:
            if cost + group.cost > room and (taken or room < self.size):
                break
            taken, cost = taken + 1, cost + group.cost
        batch, self.plain = self.plain[:taken], self.plain[taken:]
        self.plain_cost -= cost
        return batch


# What a node's SCAN gives the sampler: the keys of one page, or the error the node failed with.
ScanPage = tuple[str, "list[bytes] | redis.RedisError"]


class NodeFlows:
    """A Redis Cluster's rounds: a Rounds of its own per node (and per node an ASK reply named,
    whose commands go after ASKING), each node's next round sent as soon as its own replies
    are in. While scan() yields a node's page of keys, the commands added are that node's (a
    key is read where SCAN found it: no slot lookup); any other command goes to its slot's
    node. Follow-ups go to `follow_ups` (without: to these flows, routed by slot)."""

    def __init__(
        self, sampler: RoundSampler, nodes: ClusterNodes, size: int, follow_ups: NodeFlows | None
    ) -> None:
        self.sampler, self.nodes, self.size = sampler, nodes, size
        self.follow_ups = follow_ups or self
        self.flows: dict[tuple[str, bool], Rounds] = {}  # by node name and ASKED or not
        # Per node, the rounds its SCAN goes in, a page ahead of its reads, on a connection of
        # its own (as on one server: redis_keys._scan_ahead)
        self.scanners: dict[str, Rounds] = {}
        self.lost: dict[str, redis.RedisError] = {}  # the nodes that failed this cycle
        self.into: Rounds | None = None  # the node whose SCAN page's keys are being added
        self.running = False  # the flows are being stepped: none is flushed on its own

    # -- queueing ------------------------------------------------------------------------------

    def extend(self, commands: Iterable[Command]) -> None:
        if self.into is not None:
            self.into.queue(commands)
            return
        for command in commands:
            args = command[0]
            asked = args[0] is ASKED
            name, client = args[1] if asked else self.nodes.node_of(key_of(args))
            if name in self.lost:
                self.sampler.node_lost(name, [command], [], self.lost[name])
                continue
            self._flow(name, client, asked).queue([command])
        self._flush_if_full()

    def add_plain(self, group: PlainGroup, keys: list[PlainKey]) -> None:
        if self.into is not None:
            self.into.queue_plain(group, keys)
            return
        for plain_key in keys:  # keys not from a node's SCAN (built from values): by slot
            name, client = self.nodes.node_of(plain_key[1])
            if name in self.lost:
                self.sampler.node_lost(name, [], [plain_key], self.lost[name])
            else:
                self._flow(name, client, False).queue_plain(group, [plain_key])
        self._flush_if_full()

    def _flow(self, name: str, client: redis.Redis, asked: bool) -> Rounds:
        flow = self.flows.get((name, asked))
        if flow is None:
            flow = Rounds(self.sampler, client, self.size, self.follow_ups, asked)
            self.flows[name, asked] = flow
        return flow

    def _flush_if_full(self) -> None:
        if not self.running and any(flow.queued() >= self.size for flow in self.flows.values()):
            self.flush()

    # -- stepping the nodes --------------------------------------------------------------------

    def flush(self) -> None:
        """Send every node's commands, the nodes at once, until all are read and handled."""
        for _ in self._run(set()):
            pass

    def scan(
        self, shards: list[tuple[str, redis.Redis]], glob: str, count: int
    ) -> Iterator[ScanPage]:
        """SCAN MATCH `glob` on every shard at once: each page of keys as it comes (their
        commands then added are its node's), each node's next SCAN sent as soon as its page is
        in, a page ahead of the reads. A node that fails while it is scanned gives its error in
        place of a page, once."""
        scanning: set[str] = set()  # nodes whose SCAN has more pages to give
        for name, client in shards:
            if name in self.lost:  # failed earlier this cycle: not asked again
                yield name, self.lost[name]
                continue
            self._flow(name, client, False)
            scanner = self.scanners.get(name)
            if scanner is None:
                scanner = self.scanners[name] = Rounds(self.sampler, client, self.size, None)
            scanner.send(("SCAN", b"0", "MATCH", glob, "COUNT", count))
            scanning.add(name)
        yield from self._run(scanning)

    def _run(self, scanning: set[str]) -> Iterator[ScanPage]:
        """Step every node until none has anything left to send, read or handle (nor, of the
        nodes `scanning`, a SCAN page to give): whichever node's replies are in first is read (a
        SCAN page is yielded, its node's next SCAN sent at once), its next round sent, and the
        replies just read handled while it works on that one. If nodes failed and none answered
        this cycle, the first failure is raised: the source is down."""
        self.running = True
        try:
            while True:
                for (name, _), flow in list(self.flows.items()):
                    if flow.in_flight is None and name not in self.lost:
                        self._send(flow)
                name, first = self._first_in()
                if first is None:
                    if self._idle():
                        break
                    continue  # replies handled last queued commands for a node already passed
                flow, sent = first, first.in_flight
                assert sent is not None
                reply = self._receive(name, flow)
                if isinstance(reply, redis.RedisError):
                    if name in scanning:
                        scanning.discard(name)
                        yield name, reply  # its scan is cut short
                    continue
                if sent.leading is None:
                    continue
                cursor, keys = reply
                if cursor not in (b"0", 0):  # the next page, asked while this one's keys are read
                    flow.send((sent.leading[0], cursor, *sent.leading[2:]))
                else:
                    scanning.discard(name)
                self.into = self.flows[name, False]
                yield name, keys
                self.into = None
            if self.lost and not self.sampler.node_answered:
                raise next(iter(self.lost.values()))
        finally:
            self.running, self.into = False, None

    def _send(self, flow: Rounds) -> None:
        """Send the node's next round, if it has one."""
        while flow.in_flight is None:
            if not flow.send() and not (flow.pending or flow.plain):
                return  # nothing left: its last replies handled

    def _idle(self) -> bool:
        """No node has anything left to send or handle."""
        return not any(
            flow.pending or flow.plain or flow.unhandled
            for (name, _), flow in self.flows.items()
            if name not in self.lost
        )

    def _first_in(self) -> tuple[str, Rounds | None]:
        """The node whose round in flight is read first (its replies all in), or None when no
        round is in flight."""
        in_flight = {
            id(flow.in_flight.sent): (name, flow)
            for name, flow in self._every_rounds()
            if flow.in_flight is not None
        }
        if not in_flight:
            return "", None
        rounds = [flow.in_flight.sent for _, flow in in_flight.values() if flow.in_flight]
        return in_flight[id(SentCommands.first_in(rounds))]

    def _receive(self, name: str, flow: Rounds) -> Any:
        """The node's round read: its leading reply, or the error that lost the node."""
        sent = flow.in_flight
        try:
            reply = flow.receive()
        except redis.RedisError as error:
            assert sent is not None
            self._lose(name, error, sent)
            return error
        self.sampler.answered()
        return reply

    def _lose(self, name: str, error: redis.RedisError, sent: SentRound) -> None:
        """A node failed: what it was to read (sent, in flight or queued) loses its groups,
        and so does whatever is routed to it later this cycle; the replies it did give are
        handled."""
        self.nodes.noticed(error)
        self.lost.setdefault(name, error)
        commands, plain = list(sent.commands), list(sent.plain)
        flows = [flow for flow_name, flow in self._every_rounds() if flow_name == name]
        for flow in flows:
            dropped, dropped_plain = flow.drop()
            commands += dropped
            plain += dropped_plain
        self.sampler.node_lost(name, commands, plain, error)
        for flow in flows:
            flow.send()  # nothing to send: its last replies read are handled

    def abandon(self) -> None:
        """The cycle failed: no round in flight is read (their connections are dropped)."""
        for _, flow in self._every_rounds():
            flow.abandon()

    def _every_rounds(self) -> list[tuple[str, Rounds]]:
        """Each node's rounds, by node name: its reads' (direct and after ASKING) and its SCAN's."""
        return [(name, flow) for (name, _), flow in self.flows.items()] + list(
            self.scanners.items()
        )


def _each(reply: Any, count: int) -> Iterator[Any]:
    """The replies of a bounded_reads; if the whole command failed, its error for each read."""
    return iter(reply) if isinstance(reply, list) else itertools.repeat(reply, count)
