"""Leader election: the samplers run on one replica at a time, under a Redis lease.

The lease is one key holding `TOKEN:HOLDER` with a TTL. A replica takes it when it is free
(the key expired or was released), renews it while the value is still its own, and lets it
go at shutdown, each step one small Lua script so check and write are atomic. Every
acquisition INCRs a fencing counter next to the lease; a cycle remembers the token it started
under and publishes only if the replica still holds that same token (a replica that lost the
lease mid-cycle, paused by GC or a slow backend, drops what it read instead of serving it).

A replica counts itself leader until `lease_ttl` after it last *sent* a successful renewal,
so it steps down before the key can expire in Redis, even while Redis is unreachable; a
follower takes over within `lease_ttl + renew_interval` of the leader's death. Event
consumption is not elected: every replica reads through the consumer group.

The sampled series are tied to the lease itself, not to the next cycle: a source's snapshot
is published with the token it was taken under (`fence`), and every render checks, at that
moment and against the monotonic deadline, that the replica still holds that same token. A
replica that lost its lease, could not renew it in time (its connection partitioned, the
process stopped past `lease_ttl`) or took a new one since, serves none of them.

An attempt that gets no answer (Redis down, a READONLY replica, NOPERM, a lease key of another
type) is a WARNING naming why, once per reason and period; once none has been answered for
`lease_ttl`, `problem()` names it too: the samplers then report their sources down with reason
`leader_lease` rather than standing by (no replica failing alike can hold the lease).

Redis commands used (all on the two keys below): EVALSHA, SCRIPT LOAD and, in the scripts,
GET, SET, PEXPIRE, INCR, DEL. docs/operations.md has the details.

On a Redis Cluster a script may touch one slot only: the fencing counter is then
`{<key>}:fence`, in the lease's slot (a key with a hash tag of its own keeps `<key>:fence`),
and the scripts run on the primary of that slot, found again in the slot map after MOVED or a
lost connection (a failover).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import redis
from opentelemetry.metrics import CallbackOptions, Observation

from exporter.core.logs import LogLimiter, scrub
from exporter.leader.config import LeaderElectionConfig
from exporter.output.catalog import BY_NAME
from exporter.output.telemetry import Telemetry
from exporter.redis.connection import RedisConnectionConfig, redis_error_reason, sever

log = logging.getLogger(__name__)

# Seconds between two warnings of one lease failure reason (the first is logged at once).
PROBLEM_LOG_PERIOD = 300.0

FENCE_SUFFIX = ":fence"

# KEYS[1] lease, KEYS[2] fencing counter; ARGV[1] holder, ARGV[2] ttl in ms.
# Returns the fencing token when the caller holds the lease afterwards, else 0.
ACQUIRE_SCRIPT = """
local value = redis.call('GET', KEYS[1])
if value then
  local sep = string.find(value, ':', 1, true)
  if sep and string.sub(value, sep + 1) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return tonumber(string.sub(value, 1, sep - 1))
  end
  return 0
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. ':' .. ARGV[1], 'PX', ARGV[2])
return token
"""

# KEYS[1] lease; ARGV[1] holder. Deletes the lease only when it is the caller's.
RELEASE_SCRIPT = """
local value = redis.call('GET', KEYS[1])
if value then
  local sep = string.find(value, ':', 1, true)
  if sep and string.sub(value, sep + 1) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
  end
end
return 0
"""


class Leadership:
    """Whether this replica may sample now, and under which fencing token."""

    def __init__(
        self,
        config: LeaderElectionConfig,
        connection: RedisConnectionConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.connection = connection
        self.holder = config.holder_name()
        self._clock = clock
        self._keys = (config.key, fence_key(config.key, connection.is_cluster))
        self._ttl_ms = max(1, round(config.lease_ttl * 1000))
        self._lock = threading.Lock()
        self._token: int | None = None
        self._valid_until = 0.0
        self._problem: str | None = None  # why the last attempt got no answer, else None
        self._answered_at = clock()  # when the last answered attempt was sent (or the start)
        self._problem_log = LogLimiter(log, period=PROBLEM_LOG_PERIOD)
        self.attempts = 0  # renewals tried, answered or not
        self._client: redis.Redis | None = None
        self.thread: threading.Thread | None = None

    # -- what the samplers ask --------------------------------------------------------------

    def token(self) -> int | None:
        """The fencing token while this replica holds an unexpired lease, else None."""
        with self._lock:
            if self._token is not None and self._clock() < self._valid_until:
                return self._token
            return None

    def is_leader(self) -> bool:
        return self.token() is not None

    def fence(self) -> Callable[[], bool]:
        """For a snapshot taken now: True while this replica still holds the lease it is
        taken under (the same token, not yet expired); checked at every render."""
        token = self.token()
        return lambda: token is not None and self.token() == token

    def problem(self) -> str | None:
        """Why the lease cannot be held (Redis down, READONLY, NOPERM, WRONGTYPE...) once no
        attempt has been answered for `lease_ttl`: by then any lease taken before has expired,
        so no replica that fails alike holds one. None while Redis answers (this replica or
        another leads), and during a shorter blip (a leader still holds its lease then)."""
        with self._lock:
            if self._problem is None:
                return None
            if self._clock() - self._answered_at < self.config.lease_ttl:
                return None
            return self._problem

    # -- the renewal loop -------------------------------------------------------------------

    def start(self, stop: threading.Event) -> None:
        self.thread = threading.Thread(
            target=self.run, args=(stop,), name="leader-election", daemon=True
        )
        self.thread.start()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.renew()
            stop.wait(self.config.renew_interval)

    def renew(self) -> bool:
        """Take or keep the lease; True when this replica holds it afterwards."""
        sent = self._clock()
        self.attempts += 1
        was_leader = self.is_leader()
        try:
            token = int(self._run(ACQUIRE_SCRIPT, self._keys, (self.holder, self._ttl_ms)))
        except redis.RedisError as error:
            self._drop_client()
            self._cannot_hold(error)
            if was_leader and not self.is_leader():
                log.warning("leader election: %s's lease lapsed without an answer", self.holder)
            return self.is_leader()  # still leader until the lease sent before could expire
        with self._lock:
            if self._problem is not None:
                log.info("leader election: the lease's Redis answers again")
            self._problem, self._answered_at = None, sent
            if token:
                self._token, self._valid_until = token, sent + self.config.lease_ttl
            else:
                self._token = None
        if token and not was_leader:
            log.info("leader election: %s leads (fencing token %d)", self.holder, token)
        elif not token and was_leader:
            log.warning("leader election: %s lost the lease", self.holder)
        return bool(token)

    def _cannot_hold(self, error: redis.RedisError) -> None:
        """Remember and report (a WARNING per reason and period) why the lease got no answer."""
        text = scrub(str(error)).splitlines()[0][:300] if str(error) else ""
        why = f"{redis_error_reason(error)}: {type(error).__name__}: {text}"
        with self._lock:
            self._problem = why
        self._problem_log.warning(
            type(error).__name__,
            "leader election: %s cannot take or renew the lease %s (%s); while no replica "
            "holds it no replica samples",
            self.holder,
            self.config.key,
            why,
        )

    def interrupt(self) -> None:
        """Shutdown: a renewal blocked on a hung Redis fails now, so the loop sees the stop."""
        sever(self._client)

    def release(self, timeout: float | None = None) -> None:
        """Give the lease up now (shutdown), so a follower takes over at its next attempt.

        `timeout` bounds the connect and the command: a hung Redis must not hold the exit (the
        lease then expires by itself within lease_ttl)."""
        with self._lock:
            held, self._token = self._token is not None, None
        if held:
            try:
                if timeout is not None:  # on a cluster this reads the slot map: in the try
                    self._drop_client()
                    bounded = {"socket_timeout": timeout, "connect_timeout": timeout}
                    bounded_connection = self.connection.model_copy(update=bounded)
                    self._client = bounded_connection.connect_for_key(self._keys[0])
                self._run(RELEASE_SCRIPT, self._keys[:1], (self.holder,))
                log.info("leader election: %s released the lease", self.holder)
            except redis.RedisError as error:
                log.warning("leader election: could not release the lease: %s", error)
        self._drop_client()

    def _run(self, script: str, keys: tuple[str, ...], args: tuple[str | int, ...]) -> int:
        """EVALSHA through redis-py's Script, which loads the script again after NOSCRIPT (a
        SCRIPT FLUSH, a restarted or failed-over server)."""
        return int(self._connect().register_script(script)(keys=keys, args=args))

    def _connect(self) -> redis.Redis:
        """The server of the lease (on a cluster, its slot's primary as the map says now)."""
        if self._client is None:
            self._client = self.connection.connect_for_key(self._keys[0])
        return self._client

    def _drop_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def fence_key(key: str, cluster: bool) -> str:
    """The fencing counter's key: `<key>:fence`, or on a Redis Cluster `{<key>}:fence` for a
    key without a hash tag, so that it shares the lease's slot (hence its scripts' node)."""
    if not cluster or _hash_tag(key):
        return key + FENCE_SUFFIX
    return "{" + key + "}" + FENCE_SUFFIX


def _hash_tag(key: str) -> str:
    """What Redis Cluster hashes of a key: the text between its first `{` and the `}` after it,
    when not empty; "" when the key has no such tag (its whole name is hashed)."""
    opening = key.find("{")
    closing = key.find("}", opening + 1) if opening >= 0 else -1
    return key[opening + 1 : closing] if closing > opening + 1 else ""


def register_leader_gauge(telemetry: Telemetry, leadership: Leadership | None) -> None:
    """queue_exporter_leader: 1 on the replica that samples (always, without election)."""

    def observe(_: CallbackOptions) -> Iterator[Observation]:
        yield Observation(1 if leadership is None or leadership.is_leader() else 0)

    telemetry.meter.create_observable_gauge(
        "queue_exporter_leader",
        callbacks=[observe],
        description=BY_NAME["queue_exporter_leader"].help,
    )


def lease_connection(
    election: LeaderElectionConfig, *candidates: RedisConnectionConfig | None
) -> RedisConnectionConfig:
    """The lease's Redis: its own, else the first configured source's, else the default."""
    for connection in (election.redis, *candidates):
        if connection is not None:
            return connection
    return RedisConnectionConfig()
