"""BullMQ's workers as BullMQ counts them: the connections named for a queue in CLIENT LIST.

Every BullMQ Worker names its blocking connection with CLIENT SETNAME
`<prefix>:<base64 of the queue name>`, or `<prefix>:<base64>:w:<worker name>` when the worker
has a name, and `Queue.getWorkers()` lists the CLIENT LIST entries whose name is that, or
starts with the `:w:` form (BullMQ 5.x and 6.x, queue-getters.js), of every database: here
only the reader's database counts. One CLIENT LIST per read serves every queue. On a Redis Cluster, where each connection appears on every node it opened,
the node listing the most worker connections is read, as BullMQ does.

Busy or idle: an idle worker waits for its next job blocked on that connection (CLIENT LIST
flags `b`, in BZPOPMIN); a worker whose slots are all taken does not wait. So a worker blocked
is idle, one not blocked is busy. No slots are served: CLIENT LIST does not tell a worker's
concurrency (none made up). A worker between two jobs reads as busy for that instant.

CLIENT LIST refused (an ACL without `+client|list`, a server without CLIENT or with it
renamed) costs the worker count alone: the reader goes on, says why `queue_workers` is left out
(Signals.silent: its log, the status page, queue_exporter_native_silent) and serves every
other series.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class WorkerConnection:
    """One worker's named connection: its queue, a stable identity, and whether it waits."""

    queue: str
    identity: str  # the connection's name and client id: two unnamed workers stay apart
    waiting: bool


def client_list_refused(error: Exception) -> str:
    """Why a reader serves no worker count: CLIENT LIST was refused with `error`."""
    first_line = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
    return (
        f"CLIENT LIST refused ({first_line}): queue_workers is not served, every other series "
        "is; the ACL needs +client|list (or the server its CLIENT command)"
    )


def client_name(prefix: str, queue: str) -> str:
    """The connection name BullMQ gives a worker of `queue` (its `:w:<name>` form starts so)."""
    return f"{prefix}:{base64.b64encode(queue.encode()).decode()}"


def worker_connections(
    clients: Iterable[Mapping[str, Any]], prefix: str, queues: Iterable[str], database: int
) -> list[WorkerConnection]:
    """The worker connections of the known queues among CLIENT LIST's entries (redis-py's
    client_list(): a mapping of fields per connection) that last used `database`: CLIENT LIST
    lists every database's, and a queue of the same name in another one is another queue
    (Queue.getWorkers() counts those too)."""
    names = {client_name(prefix, queue): queue for queue in queues}
    wanted_db = str(database)
    found = []
    for fields in clients:
        if str(fields.get("db", "")) != wanted_db:
            continue
        name = str(fields.get("name", ""))
        named_at = name.find(":w:", len(prefix) + 1)
        queue = names.get(name if named_at < 0 else name[:named_at])
        if queue is not None:
            waiting = "b" in str(fields.get("flags", ""))
            found.append(WorkerConnection(queue, f"{name}#{fields.get('id', '')}", waiting))
    return found
