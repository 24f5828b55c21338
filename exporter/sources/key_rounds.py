"""The round machinery of the Redis key sampler: commands sent a pipeline_size round at a time.

A round is one round trip (on a Redis Cluster, one per node, all sent before any is read); each
round is sent before the previous one's replies are handled, so Redis works on it while this
process parses those. What the replies mean is the sampler's (RoundSampler): these classes only
batch, send, read and sort replies out, and hand them back to it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import redis

from exporter.redis_cluster import ClusterNodes
from exporter.redis_pipeline import Args, SentCommands

if TYPE_CHECKING:  # types only: the sampler imports this module
    from exporter.sources.redis_keys import Command, NodeScans, PlainKey, _PlainGroup


# How a round is sent (RedisKeySampler.send_round): the client, the commands, a leading SCAN
# (on a cluster, one per node), the plain groups' keys.
SendRound = Callable[
    [redis.Redis, list["Command"], "Args | NodeScans | None", list["PlainKey"]],
    "SentRound | NodesRound",
]


class RoundSampler(Protocol):
    """What a sent round asks of the sampler (RedisKeySampler): what its commands send, how
    its replies are handled, and who hears of a cluster node lost."""

    _node_answered: bool  # some cluster node answered this cycle: the source is up

    def _round_commands(
        self, commands: list[Command], leading: Args | None, plain: list[PlainKey]
    ) -> tuple[list[Args], int]: ...

    def _handle(self, commands: list[Command], replies: list[Any]) -> Iterator[Command]: ...

    def _handle_plain(
        self, keys: list[PlainKey], depths: list[Any], heads: list[Any]
    ) -> list[Command]: ...

    def _node_lost(
        self, node: str, lost: SentRound | NodeShare, error: redis.RedisError
    ) -> None: ...


# Marks a command sent again to the node an ASK reply named: (ASKED, (node name, client), args).
ASKED = object()


# Marks a read whose reply is one queue item (a head item, the hash field it names, a stream
# entry): its arguments are (ITEM_READ, key, script_read(...)). Item reads travel in one
# bounded_reads per round, so an item over max_item_bytes stays in Redis.
ITEM_READ = object()


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
            direct, self.reads = sampler._round_commands(commands, leading, plain)
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
        follow_ups = list(sampler._handle(self.commands, replies.replies))
        return follow_ups + sampler._handle_plain(self.plain, replies.depths, replies.heads)


class NodesRound:
    """One round on a cluster: each node's commands and plain keys in a round trip of its own
    (a SentRound), all sent before any is read, so the nodes work at once; a node's SCAN
    (`scans`: node name -> its client and SCAN) first in its round trip. A node that fails
    loses the groups of its keys; if no node answered this cycle, the source is down."""

    def __init__(
        self,
        sampler: RoundSampler,
        nodes: ClusterNodes,
        commands: list[Command],
        scans: NodeScans,
        plain: list[PlainKey],
    ) -> None:
        self.sampler, self.nodes, self.scans = sampler, nodes, scans
        self.answered: list[SentRound] = []
        shares: dict[tuple[str, bool], NodeShare] = {
            (name, False): NodeShare(node_client) for name, (node_client, _) in scans.items()
        }
        for command in commands:
            asked = command[0][0] is ASKED
            name, node_client = command[0][1] if asked else nodes.node_of(key_of(command[0]))
            _share(shares, name, asked, node_client).commands.append(command)
        node_of = nodes.node_of
        for key in plain:
            name, node_client = node_of(key[1])
            share = shares.get((name, False))  # a round's keys are on a few nodes: made once each
            (share or _share(shares, name, False, node_client)).plain.append(key)
        self.sent = {where: self._send(where, share) for where, share in shares.items()}

    def _send(self, where: tuple[str, bool], share: NodeShare) -> SentRound | NodeShare:
        name, asked = where
        scan = self.scans[name][1] if name in self.scans and not asked else None
        try:
            return SentRound(self.sampler, share.client, share.commands, scan, share.plain, asked)
        except redis.RedisError as error:
            share.error = error
            return share

    def receive(self) -> dict[str, Any]:
        """Read each node's replies: each SCAN's reply (the error where its node failed)."""
        sampler, scanned = self.sampler, {}
        failures = 0
        for (name, asked), sent in self.sent.items():
            try:
                if isinstance(sent, NodeShare):  # sending failed
                    assert sent.error is not None
                    raise sent.error
                reply = sent.receive()
            except redis.RedisError as error:
                failures += 1
                if failures == len(self.sent) and not sampler._node_answered:
                    raise  # no node answered: the source is down
                self.nodes.noticed(error)
                sampler._node_lost(name, sent, error)
                reply = error
            else:
                sampler._node_answered = True
                self.answered.append(sent)
            if name in self.scans and not asked:
                scanned[name] = reply
        return scanned

    def handle(self) -> list[Command]:
        """Handle the replies of the nodes that answered; their follow-ups."""
        return [command for sent in self.answered for command in sent.handle()]


class NodeShare:
    """What one round sends a cluster node: its commands and its plain groups' keys (and the
    error sending them met)."""

    __slots__ = ("client", "commands", "error", "plain")

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.commands: list[Command] = []
        self.plain: list[PlainKey] = []
        self.error: redis.RedisError | None = None


def _share(
    shares: dict[tuple[str, bool], NodeShare], name: str, asked: bool, client: redis.Redis
) -> NodeShare:
    """The share of the round for this node (and kind: ASKED or not), made if new."""
    share = shares.get((name, asked))
    if share is None:
        share = shares[name, asked] = NodeShare(client)
    return share


def _round_replies(
    commands: list[Command], leading: Args | None, replies: list[Any], reads: int
) -> _Replies:
    """A round trip's replies (RoundSampler._round_commands) sorted out: the leading
    command's, the commands' in order, the plain keys' depths and item reads."""
    read_replies = _each(replies.pop(), reads) if reads else iter(())
    direct_replies = iter(replies)
    leading_reply = None if leading is None else next(direct_replies)
    ordered = [
        next(read_replies) if args[0] is ITEM_READ else next(direct_replies)
        for args, _, _ in commands
    ]
    return _Replies(leading_reply, ordered, list(direct_replies), list(read_replies))


# How many rounds of commands may wait for the next SCAN to carry them (a SCAN COUNT 1000 page
# of keys with two reads each is about two).
_CARRIED_ROUNDS = 4


class Rounds:
    """Collects commands and sends them a pipeline_size round at a time."""

    def __init__(
        self, send_round: SendRound, client: redis.Redis, size: int, follow_ups: Rounds | None
    ) -> None:
        self.send_round = send_round
        self.client = client
        self.follow_ups = follow_ups
        self.size = size
        self.pending: list[Command] = []
        self.plain: list[PlainKey] = []
        self.plain_cost = 0  # the commands the plain keys take: one or two each
        # True while the next SCAN will carry the pending commands: they wait for it (a SCAN
        # page's worth, bounded by _CARRIED_ROUNDS rounds) rather than go in a round of their own.
        self.carried = False
        self.unhandled: SentRound | NodesRound | None = None  # read, not yet handled

    def extend(self, commands: Iterable[Command]) -> None:
        self.pending.extend(commands)
        self._flush_if_full()

    def add_plain(self, group: _PlainGroup, keys: list[PlainKey]) -> None:
        """Keys of one plain group (a page of them), sent once rounds fill."""
        self.plain += keys
        self.plain_cost += group.cost * len(keys)
        self._flush_if_full()

    def _flush_if_full(self) -> None:
        queued = len(self.pending) + self.plain_cost
        if queued >= self.size * (_CARRIED_ROUNDS if self.carried else 1):
            self.flush()

    def flush(self, leading: Args | NodeScans | None = None) -> Any:
        """Send the pending commands a round at a time, `leading` (a SCAN; on a cluster a SCAN
        per node) first in the first round, even with nothing pending; its reply is returned
        (on a cluster, each node's). Each round's replies are handled once the next round is
        sent (the last round's: at the next flush, or once nothing is left to send)."""
        leading_reply = None
        while self.pending or self.plain or leading is not None or self.unhandled is not None:
            if not (self.pending or self.plain or leading is not None):
                self._handle_unhandled()  # may queue follow-ups: another round
                continue
            batch, self.pending = self.pending[: self.size], self.pending[self.size :]
            plain = self._take_plain(self.size - len(batch))
            sent = self.send_round(self.client, batch, leading, plain)
            self._handle_unhandled()  # while Redis works on the round just sent
            reply = sent.receive()
            self.unhandled = sent
            if leading is not None:
                leading_reply, leading = reply, None
        return leading_reply

    def _handle_unhandled(self) -> None:
        """Handle the replies of the round read last; its follow-ups go to the follow-up
        rounds, or (a follow-up's own: a redirected read's hash read, on a cluster) to the next
        round of these."""
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


def _each(reply: Any, count: int) -> Iterator[Any]:
    """The replies of a bounded_reads; if the whole command failed, its error for each read."""
    return iter(reply) if isinstance(reply, list) else itertools.repeat(reply, count)


def key_of(args: tuple[Any, ...]) -> bytes:
    """The key a command reads (XINFO GROUPS names it second, a one-key EVAL_RO third; a
    command sent after an ASK wraps the command)."""
    if args[0] is ASKED:
        return key_of(args[2])
    key = args[2] if args[0] == "XINFO" else args[3] if args[0] == "EVAL_RO" else args[1]
    return key if isinstance(key, bytes) else str(key).encode()
