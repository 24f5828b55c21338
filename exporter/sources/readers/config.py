"""The `sources.native` settings: light models the configuration reads without the readers.

Each reader's section says what the reader reads and the least Redis permissions it needs
(redis_acl.py); the readers themselves, and redis-py, load only when one is enabled.
"""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import Field, field_validator

from exporter.core.models import StrictModel
from exporter.redis.connection import RedisConnectionConfig
from exporter.sources.redis_keys.groups import literal, scan_glob

# RQ's job registries the RQ reader reads (rq:<registry>:<queue>).
RQ_REGISTRIES = ("wip", "finished", "failed")


class ReaderConfig(StrictModel):
    """Settings every native reader has; a reader's own config adds its fields."""

    enabled: bool = Field(True, description="read the system's own signals (off: depth only)")
    system: str = Field(min_length=1, description="the system label of what it reports")
    interval: float | None = Field(
        None, gt=0, description="seconds between reads (default: the global sample interval)"
    )
    redis: RedisConnectionConfig | None = Field(
        None, description="where the system's data lives (default: sources.redis's connection)"
    )

    # The least Redis permissions the reader needs (redis_acl.py): commands, and ACL glob
    # patterns of the keys it reads; writes, where a reader must make any, are its own to say.
    ACL_COMMANDS: ClassVar[tuple[str, ...]] = ()
    # Commands whose refusal costs one figure only (the reader reads the rest), and which.
    ONE_FIGURE: ClassVar[dict[str, str]] = {}

    def commands_sent(self) -> tuple[str, ...]:
        """The commands its reads send, as this configuration has them."""
        return self.ACL_COMMANDS

    def acl_read_keys(self) -> list[str]:
        return []

    def acl_value_reads(self) -> list[tuple[str, str]]:
        """(command, key glob) pairs of commands that read a string's value (GET, MGET): ACL
        selectors grant each on its keys alone (redis_acl.py), since `%R~` on a broad glob with
        GET granted everywhere would let the sidecar read any string, secrets included."""
        return []

    def acl_channels(self, connection: RedisConnectionConfig) -> list[str]:
        """Pub/Sub channel patterns it subscribes or publishes to, as ACL `&` rules take them."""
        return []

    def acl_writes(self, connection: RedisConnectionConfig) -> list[str]:
        """ACL selectors of the writes it must make, each on its own keys and channels
        (redis_acl.py); none by default: a reader reads."""
        return []

    def record_globs(self) -> list[str]:
        """SCAN globs of the keys whose presence shows the system has run against this
        database: `check-config --connect` warns of a reader none of them matches."""
        return self.acl_read_keys()


class RqReaderConfig(ReaderConfig):
    system: str = Field("rq", min_length=1, description="the system label")
    queues_set: str = Field("rq:queues", min_length=1, description="the set of queue keys")
    queues: list[str] = Field(
        default_factory=lambda: ["*"],
        description="the queues read, as the preset's key groups' select: names (read even "
        "when not found) and globs ('*': every queue found)",
    )

    ACL_COMMANDS = (
        "sscan",
        "zrange",
        "zrangebyscore",
        "zrevrangebyscore",
        "zcount",
        "zrank",
        "hmget",
        "hget",
        "xrevrange",
    )

    def acl_read_keys(self) -> list[str]:
        registries = [f"rq:{registry}:*" for registry in RQ_REGISTRIES]
        workers = ["rq:workers", "rq:worker:*"]
        jobs = ["rq:job:*", "rq:results:*", "rq:rl-keys", "rq:rl:*"]
        return [scan_glob(self.queues_set), *registries, *workers, *jobs]


# What a Celery inspection round writes (celery_inspect.py, which imports these): the reply
# exchange's bindings, kombu's binding deadlines, and the reply queues `<oid>.<exchange>`.
INSPECT_REPLY_EXCHANGE = "reply.celery.pidbox"
INSPECT_BINDINGS = f"_kombu.binding.{INSPECT_REPLY_EXCHANGE}"
INSPECT_DEADLINES = "_kombu.binding_deadlines"


class CeleryReaderConfig(ReaderConfig):
    system: str = Field("celery", min_length=1, description="the system label")
    queues: list[str] = Field(
        default_factory=lambda: ["*"],
        description="the queues served, as the key groups' select: names and globs ('*': every "
        "queue); a name or a queue found in kombu's bindings reads active 0 when none runs",
    )
    unknown_queue: str = Field(
        "(unknown)",
        min_length=1,
        description="queue label of tasks whose queue the reader could not learn (no task-sent "
        "event, their worker serves several queues, the task name was seen on none or several): "
        "no real queue's name, so no dashboard mistakes it for one",
    )
    inspect: bool = Field(
        True,
        description="one round of Celery's broadcast inspection per read (stats, active_queues, "
        "active, reserved, as `celery inspect` sends them): each worker's queues, slots and "
        "running tasks; it writes as `celery inspect` does (a reply queue bound, then deleted: "
        "redis-acl prints the rules). Off, for read-only deployments: no slot series, workers "
        "and the tasks of workers of several queues under unknown_queue",
    )
    inspect_timeout: float = Field(
        1.0,
        gt=0,
        description="seconds a round waits for replies at most (a quarter of the interval at "
        "most); it ends sooner once every known worker answered",
    )
    control_channel: str | None = Field(
        None,
        description="Pub/Sub channel of Celery's remote control (default: kombu's "
        "/<db>.celery.pidbox)",
    )
    events_timeout: float = Field(
        30.0,
        gt=0,
        description="seconds without any event after which the reader reports none, and "
        "without a heartbeat after which a worker is gone",
    )
    report_no_events: bool = Field(
        True,
        description="when no event comes for events_timeout, say so (log, status page, "
        "queue_exporter_native_silent) and leave running tasks' active depth out (off: it "
        "reads 0); the source stays up either way",
    )
    unacked_key: str = Field("unacked", min_length=1, description="kombu's unacked hash")
    sep: str = Field(
        "\x06\x16", min_length=1, description="kombu's sep transport option (bindings' members)"
    )
    not_task_queues: str | None = Field(
        None,
        description="regex of queue names found in kombu's bindings that are no task queues "
        "(the celery preset: the pidbox and event receivers' queues)",
    )
    events_channel: str | None = Field(
        None,
        description="Pub/Sub pattern Celery's events are published on "
        "(default: kombu's /<db>.celeryev/*)",
    )

    ACL_COMMANDS = ("hscan", "psubscribe", "scan", "sscan")

    @field_validator("not_task_queues")
    @classmethod
    def _compiles(cls, regex: str | None) -> str | None:
        if regex is not None:
            try:
                re.compile(regex)
            except re.error as error:
                raise ValueError(f"not a regular expression: {error}") from None
        return regex

    def acl_read_keys(self) -> list[str]:
        return ["_kombu.binding.*", scan_glob(self.unacked_key)]

    def record_globs(self) -> list[str]:
        # kombu's bindings: each queue a worker or producer declared (its events come on Pub/Sub)
        return ["_kombu.binding.*", scan_glob(self.unacked_key)]

    def acl_channels(self, connection: RedisConnectionConfig) -> list[str]:
        return [self.channel_pattern(connection)]

    def acl_writes(self, connection: RedisConnectionConfig) -> list[str]:
        """The writes an inspection round makes, in a selector of their own: its reply queue's
        binding, kombu's binding deadline, the reply list, and PUBLISH on the control channel
        alone (not on the events' channels)."""
        if not self.inspect:
            return []
        keys = [INSPECT_BINDINGS, INSPECT_DEADLINES, f"*.{INSPECT_REPLY_EXCHANGE}"]
        commands = ("publish", "sadd", "srem", "zadd", "brpop", "del", "multi", "exec")
        rules = [*(f"~{key}" for key in keys), f"&{self.control(connection)}"]
        return [f"({' '.join([*rules, *(f'+{command}' for command in commands)])})"]

    def control(self, connection: RedisConnectionConfig) -> str:
        """kombu publishes the celery.pidbox fanout exchange's commands on this channel."""
        if self.control_channel is not None:
            return self.control_channel
        return f"/{connection.database}.celery.pidbox"

    def channel_pattern(self, connection: RedisConnectionConfig) -> str:
        """kombu publishes a fanout exchange's messages on `/<db>.<exchange>/<routing key>`."""
        if self.events_channel is not None:
            return self.events_channel
        return f"/{connection.database}.celeryev/*"


class BullmqReaderConfig(ReaderConfig):
    system: str = Field("bullmq", min_length=1, description="the system label")
    prefix: str = Field("bull", min_length=1, description="BullMQ's key prefix")
    queues: list[str] = Field(
        default_factory=lambda: ["*"],
        description="the queues read, as the preset's key groups' select: names (read even "
        "when not found) and globs ('*': every queue found)",
    )
    max_events: int = Field(
        10000, ge=1, description="events read per queue and read; the rest at the next read"
    )
    workers: bool = Field(
        True,
        description="count each queue's workers as Queue.getWorkers() does, from their named "
        "connections in one CLIENT LIST per read (needs +client|list)",
    )

    ACL_COMMANDS = ("scan", "multi", "exec", "xinfo|stream", "xread", "hmget", "client|list")
    ONE_FIGURE = {"client|list": "queue_workers"}

    def commands_sent(self) -> tuple[str, ...]:
        return tuple(c for c in self.ACL_COMMANDS if self.workers or c != "client|list")

    def acl_read_keys(self) -> list[str]:
        # meta hashes, events streams, job hashes (a hash-tagged prefix is literal text)
        return [scan_glob(literal(self.prefix)) + ":*"]

    @property
    def positions_key(self) -> str:
        """Where the reader keeps its positions (under the exporter's own keys, which the
        leader-election ACL selector already lets it GET and SET)."""
        return f"queue-exporter:native:bullmq:{self.prefix}"


class SidekiqReaderConfig(ReaderConfig):
    system: str = Field("sidekiq", min_length=1, description="the system label")
    namespace: str = Field("", description="key prefix (redis-namespace), as the preset's")
    queues: list[str] = Field(
        default_factory=lambda: ["*"],
        description="the queues whose workers are counted, as the preset's key groups' select: "
        "names and globs ('*': every queue)",
    )

    ACL_COMMANDS = ("sscan", "hmget")

    def acl_read_keys(self) -> list[str]:
        # process hashes are named by identity (hostname:pid:nonce): any key of the namespace
        return [scan_glob(self.namespace) + "*"]

    def acl_value_reads(self) -> list[tuple[str, str]]:
        return [("mget", scan_glob(self.namespace) + "stat:*")]  # stat:processed, stat:failed

    def record_globs(self) -> list[str]:
        # its queue set, process set and counters: any key of the namespace says nothing
        return [scan_glob(self.namespace) + name for name in ("queues", "processes", "stat:*")]


class ResqueReaderConfig(ReaderConfig):
    system: str = Field("resque", min_length=1, description="the system label")
    namespace: str = Field(
        "resque", min_length=1, description="Resque's key namespace (keys are <namespace>:...)"
    )
    queues: list[str] = Field(
        default_factory=lambda: ["*"],
        description="the queues whose workers and running jobs are served, as the preset's key "
        "groups' select: names and globs ('*': every queue)",
    )

    ACL_COMMANDS = ("sscan",)

    def acl_read_keys(self) -> list[str]:
        # the queue and worker sets; each worker's record is named by its id (host:pid:queues)
        ns = scan_glob(literal(self.namespace))
        return [f"{ns}:queues", f"{ns}:workers", f"{ns}:worker:*"]

    def acl_value_reads(self) -> list[tuple[str, str]]:
        ns = scan_glob(literal(self.namespace))
        # stat:processed and stat:failed; the job each worker runs
        return [("mget", f"{ns}:stat:*"), ("get", f"{ns}:worker:*")]

    def record_globs(self) -> list[str]:
        ns = scan_glob(literal(self.namespace))
        return [f"{ns}:queues", f"{ns}:workers", f"{ns}:stat:*"]


class SaqReaderConfig(ReaderConfig):
    system: str = Field("saq", min_length=1, description="the system label")
    queues: list[str] = Field(
        default_factory=lambda: ["default"],
        description="queues whose counters exist from the start (besides every queue with "
        "live workers' stats)",
    )
    runtimes: bool = Field(
        True,
        description="execution and wait times, and the failed jobs kept, from each finished "
        "job's record, read once SAQ announced it (PSUBSCRIBE saq:job:*: a GET and a PTTL per "
        "newly finished job, and of each kept one once; a SCAN of saq:* and a PTTL per job "
        "key at the first read and after a gap in the subscription)",
    )
    ACL_COMMANDS = ("scan", "zrangebyscore", "lrange", "psubscribe", "pttl", "zscore", "time")
    # sent only to find finished jobs: refused, they cost the runtimes and the failed count
    # alone (saq_jobs.py)
    RUNTIME_COMMANDS: ClassVar[tuple[str, ...]] = ("psubscribe", "pttl", "zscore", "time")
    ONE_FIGURE = {
        command: "the runtimes and failed count (queue_job_execution_seconds, "
        'queue_job_wait_seconds, queue_depth{state="failed"})'
        for command in RUNTIME_COMMANDS
    }

    def commands_sent(self) -> tuple[str, ...]:
        return tuple(
            c for c in self.ACL_COMMANDS if self.runtimes or c not in self.RUNTIME_COMMANDS
        )

    def acl_read_keys(self) -> list[str]:
        # the active lists and jobs: which worker runs a job; finished jobs: runtimes
        jobs = ["saq:*:incomplete"] if self.runtimes else []
        return ["saq:*:stats", "saq:*:worker_info:*", "saq:*:active", "saq:job:*", *jobs]

    def acl_value_reads(self) -> list[tuple[str, str]]:
        return [("get", "saq:*:worker_info:*"), ("get", "saq:job:*")]

    def acl_channels(self, connection: RedisConnectionConfig) -> list[str]:
        # SAQ announces each job's status on its key (saq_announcements.py)
        return ["saq:job:*"] if self.runtimes else []

    def record_globs(self) -> list[str]:
        return ["saq:*:stats"]


class BullReaderConfig(ReaderConfig):
    system: str = Field("bull", min_length=1, description="the system label")
    prefix: str = Field("bull", min_length=1, description="Bull's key prefix")
    workers: bool = Field(
        True,
        description="count each queue's workers as Queue.getWorkers() does, from their named "
        "connections in one CLIENT LIST per read (needs +client|list)",
    )

    ACL_COMMANDS = (
        "scan",
        "zrangebyscore",
        "zrevrangebyscore",
        "zrange",
        "zcount",
        "hmget",
        "client|list",
    )
    ONE_FIGURE = {"client|list": "queue_workers"}

    def commands_sent(self) -> tuple[str, ...]:
        return tuple(c for c in self.ACL_COMMANDS if self.workers or c != "client|list")

    def acl_read_keys(self) -> list[str]:
        # id counters, completed and failed sets, job hashes (named by id)
        return [scan_glob(literal(self.prefix)) + ":*"]

    def record_globs(self) -> list[str]:
        return [scan_glob(literal(self.prefix)) + ":*:id"]


class NativeConfig(StrictModel):
    rq: RqReaderConfig | None = None
    bullmq: BullmqReaderConfig | None = None
    celery: CeleryReaderConfig | None = None
    sidekiq: SidekiqReaderConfig | None = None
    saq: SaqReaderConfig | None = None
    bull: BullReaderConfig | None = None
    resque: ResqueReaderConfig | None = None

    def enabled(self) -> list[ReaderConfig]:
        return list(self.enabled_by_name().values())

    def enabled_by_name(self) -> dict[str, ReaderConfig]:
        """The readers turned on, by their section name."""
        sections = {name: getattr(self, name) for name in type(self).model_fields}
        return {
            name: reader
            for name, reader in sections.items()
            if isinstance(reader, ReaderConfig) and reader.enabled
        }
