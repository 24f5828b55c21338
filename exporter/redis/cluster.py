"""A Redis Cluster as the key sampler reads it: every shard scanned, each key read on the
node whose SCAN found it (other commands on the node that owns their key's slot), the nodes'
round trips in parallel.

redis-py's RedisCluster knows the slot map (from the seed nodes in a redis+cluster:// URL)
and keeps one plain client per node; the sampler's own hiredis pipelines then run on those
clients unchanged (its bounded-reads script is flagged allow-cross-slot-keys: one script per
node and round, whatever slots its keys are in), each node sent its next round as soon as its
own replies are in (key_rounds.Transport), so the nodes work at once. A node that fails costs only the keys it
owns. An ASK reply (a key already moved to the node importing its slot) is followed: the
command is sent again to that node after ASKING. A MOVED reply naming the node the slot map
already gives the key (it was read where SCAN found it, on the node importing its slot) sends
it there; any other MOVED reply costs its key's group this cycle, and the slot map is read
again before the next one.
"""

from __future__ import annotations

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

# A cluster's slot map, read again before the next cycle after these replies.
_MAP_CHANGED = ("MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN")


class ClusterNodes:
    """The nodes of one cluster, for one sampler."""

    def __init__(self, cluster: RedisCluster, read_from_replicas: bool = False) -> None:
        self.cluster = cluster
        self.read_from_replicas = read_from_replicas
        self._stale_map = False

    def refresh_if_moved(self) -> None:
        """Read the slot map again if the last cycle met a sign that it changed."""
        if self._stale_map:
            self._stale_map = False
            self.cluster.nodes_manager.initialize()

    def noticed(self, error: Exception) -> bool:
        """An error from a node: True (and the slot map read again before the next cycle) when
        it says the slot map changed or the node is gone."""
        if str(error).startswith(_MAP_CHANGED) or isinstance(error, redis.ConnectionError):
            self._stale_map = True
            return True
        return False

    def primaries(self) -> list[tuple[str, redis.Redis]]:
        """Every primary, by name (host:port), with its client."""
        return [(node.name, self._client(node)) for node in self.cluster.get_primaries()]  # type: ignore[no-untyped-call]

    def shards(self) -> list[tuple[str, redis.Redis]]:
        """One node per shard to SCAN: its primary, or with read_from_replicas a replica of it
        where it has one."""
        if not self.read_from_replicas:
            return self.primaries()
        chosen: dict[str, ClusterNode] = {}
        for nodes in self.cluster.nodes_manager.slots_cache.values():
            chosen.setdefault(nodes[0].name, nodes[1] if len(nodes) > 1 else nodes[0])
        if any(node.server_type != "replica" for node in chosen.values()):
            self._stale_map = True  # a shard without a replica yet: look again next cycle
        return [(node.name, self._client(node)) for node in chosen.values()]

    def node_of(self, key: bytes) -> tuple[str, redis.Redis]:
        """The node that serves the key's slot: its primary, or with read_from_replicas its
        first replica where it has one (the same one SCAN reads)."""
        slot = key_slot(key)
        nodes = self.cluster.nodes_manager.slots_cache.get(slot)
        if not nodes:
            raise redis.ConnectionError(f"no node serves slot {slot}")
        node = nodes[1] if self.read_from_replicas and len(nodes) > 1 else nodes[0]
        return node.name, self._client(node)

    def moved_to_its_node(self, reply: Exception, key: bytes) -> bool:
        """A MOVED reply ("MOVED <slot> <host>:<port>") naming the node the slot map gives the
        key: the command went to another node (where SCAN found the key: one importing its
        slot, which answers MOVED without ASKING), not a sign that the map changed."""
        words = str(reply).split()
        if len(words) != 3 or words[0] != "MOVED":
            return False
        try:
            return words[2] == self.node_of(key)[0]
        except redis.ConnectionError:  # no node serves the slot
            return False

    def asked(self, reply: Exception) -> tuple[str, redis.Redis] | None:
        """The node an ASK reply ("ASK <slot> <host>:<port>") names, if it is one the slot map
        knows; None for any other reply."""
        words = str(reply).split()
        if len(words) != 3 or words[0] != "ASK":
            return None
        host, _, port = words[2].rpartition(":")
        node = self.cluster.get_node(host=host, port=int(port)) if port.isdigit() else None  # type: ignore[no-untyped-call]
        return None if node is None else (node.name, self._client(node))

    def sever(self) -> None:
        """From another thread: every node connection shut (a call blocked on one fails)."""
        for node in self.cluster.get_nodes():  # type: ignore[no-untyped-call]
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect(inuse_connections=True)

    def close(self) -> None:
        self.cluster.close()

    def _client(self, node: ClusterNode) -> redis.Redis:
        client = node.redis_connection or self.cluster.get_redis_connection(node)
        return client
