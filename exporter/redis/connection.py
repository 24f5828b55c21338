"""One way to open Redis for every part of the exporter: URL, ACL user, password file, TLS,
and behind Sentinel (`redis+sentinel://host:26379,host2:26379/<service>/<db>`).

Behind Sentinel the client asks the Sentinels for the master when it opens a connection, and a
caller that wants to follow a failover within its next cycle calls `follow_failover` first: a
connection to a master that is not the master any more is closed, the next opens to the new one.

Every connection has client-side deadlines (connect and per command) and no retries of its own:
redis-py retries a timed-out command 10 times by default, so one call to a frozen server would
take a minute. A caller that fails retries on its own schedule (the next cycle, the next read).

redis-py is imported by the functions that use it, not by this module: the configuration
models import RedisConnectionConfig, and reading a configuration must not load a client.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, unquote, urlsplit

from pydantic import Field, SecretStr, field_validator

from exporter.core.logs import mask_connection_string, register_secret
from exporter.core.models import StrictModel

if TYPE_CHECKING:
    import redis
    from redis.cluster import RedisCluster

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SCHEMES = ("redis", "rediss", "unix", *SENTINEL_SCHEMES, *CLUSTER_SCHEMES)


@dataclass(frozen=True)
class SentinelTarget:
    """What a redis+sentinel:// URL names: the Sentinels, the master's service name and db,
    and the master's own credentials (user:password@ of the URL)."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None
    password: str | None
    tls: bool


def _host_ports(hosts: str, default_port: int) -> tuple[tuple[str, int], ...]:
    found = []
    for host in hosts.split(","):
        name, _, port = host.rpartition(":") if ":" in host else (host, ":", str(default_port))
        if not name or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("each node must be host:port (port a number below 65536)")
        found.append((name.strip("[]"), int(port)))
    return tuple(found)


def cluster_seeds(url: str) -> tuple[tuple[str, int], ...]:
    """The seed nodes of `redis+cluster://[user:password@]host:port,host:port`."""
    parts = urlsplit(url)
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError("a Redis Cluster has database 0 only: a cluster URL names no other")
    return _host_ports(parts.netloc.rpartition("@")[2], 6379)


def sentinel_target(url: str) -> SentinelTarget:
    """Parse `redis+sentinel://[user:password@]host:port,host:port/<service>[/<db>]`; a
    ValueError says what is wrong, without quoting the URL (it may hold a password)."""
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    sentinels = _host_ports(hosts, 26379)
    path = [part for part in parts.path.split("/") if part]
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError("a Sentinel URL ends in /<service name>[/<db number>]")
    user, has_password, password = userinfo.partition(":")
    return SentinelTarget(
        sentinels=sentinels,
        service=unquote(path[0]),
        db=int(path[1]) if len(path) == 2 else 0,
        username=unquote(user) or None,
        password=unquote(password) if has_password else None,
        tls=parts.scheme == "rediss+sentinel",
    )


class RedisConnectionConfig(StrictModel):
    url: SecretStr = Field(
        SecretStr(DEFAULT_REDIS_URL),
        description="redis://, rediss:// or unix:// URL, or redis+sentinel://host:26379,"
        "host2:26379/<service>/<db> (rediss+sentinel: TLS to the Sentinels and the master), or "
        "redis+cluster://host:port,host2:port (seed nodes; not for the RQ, Celery and Sidekiq "
        "readers: those systems do not run on a cluster); "
        "a password in it is masked everywhere",
    )
    username: str | None = Field(None, description="ACL user (overrides the URL's)")
    password: SecretStr | None = Field(None, description="password (prefer password_file)")
    password_file: Path | None = Field(None, description="file holding the password")
    tls_ca_file: Path | None = Field(None, description="rediss://: CA bundle to verify the server")
    tls_cert_file: Path | None = Field(None, description="rediss://: client certificate")
    tls_key_file: Path | None = Field(None, description="rediss://: client certificate's key")
    socket_timeout: float = Field(5.0, gt=0, description="seconds a single command may take")
    connect_timeout: float = Field(
        5.0, gt=0, description="seconds opening a connection (TCP, TLS) may take"
    )
    sentinel_username: str | None = Field(None, description="Sentinel: the Sentinels' ACL user")
    sentinel_password: SecretStr | None = Field(
        None, description="Sentinel: the Sentinels' password (the URL's is the master's)"
    )
    sentinel_password_file: Path | None = Field(
        None, description="Sentinel: file holding the Sentinels' password"
    )

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: SecretStr) -> SecretStr:
        parts = urlsplit(url.get_secret_value())
        if parts.scheme not in SCHEMES:
            raise ValueError(
                f"URL scheme must be one of {', '.join(SCHEMES)}, not {parts.scheme!r}"
            )
        if parts.scheme in SENTINEL_SCHEMES:
            sentinel_target(url.get_secret_value())
            return url
        if parts.scheme in CLUSTER_SCHEMES:
            cluster_seeds(url.get_secret_value())
            return url
        try:
            parts.port  # noqa: B018  # raises for a port that is not a number
        except ValueError:
            raise ValueError("the URL's port is not a number between 0 and 65535") from None
        return url

    def resolved_password(self) -> str | None:
        return _secret(self.password, self.password_file)

    @property
    def sentinel(self) -> SentinelTarget | None:
        """The Sentinel setup the URL names, or None for a plain Redis."""
        url = self.url.get_secret_value()
        return sentinel_target(url) if url.startswith(SENTINEL_SCHEMES) else None

    @property
    def database(self) -> int:
        """The database number the URL names (as redis-py reads it: ?db= first, then the path;
        a unix:// path is the socket's)."""
        target = self.sentinel
        if target is not None:
            return target.db
        parts = urlsplit(self.url.get_secret_value())
        number = dict(parse_qsl(parts.query)).get("db")
        if number is None and parts.scheme != "unix":
            number = parts.path.strip("/")
        return int(number) if number and number.isdigit() else 0

    def masked_url(self) -> str:
        return mask_connection_string(self.url.get_secret_value())

    @property
    def server(self) -> str:
        """The Redis the URL names, without scheme or credentials: host:port/db (Sentinel:
        the Sentinels' host:port list/service/db; unix: the socket's path/db). Two connections
        with the same server read the same data; it names a stream's or a native reader's
        Redis in redis_source when no listed source shares it."""
        url = self.url.get_secret_value()
        parts = urlsplit(url)
        if parts.scheme == "unix":
            return f"{parts.path}/{self.database}"
        hosts = parts.netloc.rpartition("@")[2]
        target = self.sentinel
        default_port = 26379 if target is not None else 6379
        nodes = ",".join(f"{host}:{port}" for host, port in _host_ports(hosts, default_port))
        service = f"/{target.service}" if target is not None else ""
        return f"{nodes}{service}/{self.database}"

    def connect(self, replica: bool = False) -> redis.Redis:
        """A client whose replies are bytes: decoding is left to the few values that need it.
        `replica`: behind Sentinel, a client of the master's replicas (the master when none)."""
        import redis

        target = self.sentinel
        if target is not None:
            return self._connect_sentinel(target, replica)
        if self.is_cluster:
            raise redis.RedisError(
                "a redis+cluster:// URL has no one server: reach a key's node (connect_for_key) "
                "or the whole cluster (connect_cluster)"
            )
        return redis.Redis.from_url(self.url.get_secret_value(), **self._options())

    @property
    def is_cluster(self) -> bool:
        return self.url.get_secret_value().startswith(CLUSTER_SCHEMES)

    def connect_cluster(self, replicas: bool = False) -> RedisCluster:
        """A Redis Cluster client from the URL's seed nodes: it reads the slot map from them.
        `replicas`: its replica connections send READONLY, so replicas serve reads."""
        from redis.cluster import ClusterNode, LoadBalancingStrategy, RedisCluster

        url = self.url.get_secret_value()
        seeds = [ClusterNode(host, port) for host, port in cluster_seeds(url)]  # type: ignore[no-untyped-call]
        # Any strategy makes replica connections send READONLY; which node reads is ours to say.
        strategy = LoadBalancingStrategy.ROUND_ROBIN if replicas else None
        return RedisCluster(
            startup_nodes=seeds, load_balancing_strategy=strategy, **self._cluster_options()
        )

    def connect_for_key(self, key: bytes | str) -> redis.Redis:
        """A client of the one server that holds `key`, for commands on that key alone (a
        stream and its consumer group). On a Redis Cluster: the primary of the key's slot, as
        the slot map says now. The map is read at each call, so a caller that reconnects after
        MOVED, ASK or a lost connection finds the key where it went (a resharding, a replica
        promoted in a failover). Elsewhere: `connect()`."""
        import redis
        from redis.exceptions import RedisClusterException

        if not self.is_cluster:
            return self.connect()
        try:
            with self.connect_cluster() as cluster:
                node = cluster.get_node_from_key(key)
        except RedisClusterException as error:  # no seed answered: as any lost connection
            raise redis.ConnectionError(f"no cluster node answered: {error}") from error
        return redis.Redis(host=node.host, port=node.port, **self._cluster_options())

    def _cluster_options(self) -> dict[str, Any]:
        """Options for each node of a cluster: the URL's credentials unless set apart."""
        parts = urlsplit(self.url.get_secret_value())
        options = self._options(tls=parts.scheme == "rediss+cluster")
        user, has_password, password = parts.netloc.rpartition("@")[0].partition(":")
        if has_password:
            options.setdefault("password", unquote(password))
        if user:
            options.setdefault("username", unquote(user))
        return options

    def _options(self, tls: bool = False) -> dict[str, Any]:
        """Deadlines, no retries, TLS files and credentials: for a Redis or a Sentinel."""
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        options: dict[str, Any] = {
            "socket_timeout": self.socket_timeout,
            "socket_connect_timeout": self.connect_timeout,
            "retry": Retry(NoBackoff(), 0),
        }
        if tls:
            options["ssl"] = True
        if self.tls_ca_file:
            options["ssl_ca_certs"] = str(self.tls_ca_file)
        if self.tls_cert_file:
            options["ssl_certfile"] = str(self.tls_cert_file)
        if self.tls_key_file:
            options["ssl_keyfile"] = str(self.tls_key_file)
        password = self.resolved_password()
        if password is not None:
            options["password"] = password
        if self.username:
            options["username"] = self.username
        options["health_check_interval"] = 30
        return options

    def _connect_sentinel(self, target: SentinelTarget, replica: bool = False) -> redis.Redis:
        from redis.sentinel import Sentinel

        master = self._options(tls=target.tls)
        master.setdefault("password", target.password)
        master.setdefault("username", target.username)
        asking = self._options(tls=target.tls)
        for name in ("password", "username", "health_check_interval"):
            asking.pop(name, None)
        sentinel_password = _secret(self.sentinel_password, self.sentinel_password_file)
        if sentinel_password is not None:
            asking["password"] = sentinel_password
        if self.sentinel_username:
            asking["username"] = self.sentinel_username
        sentinels = Sentinel(list(target.sentinels), sentinel_kwargs=asking)  # type: ignore[no-untyped-call]
        connect = sentinels.slave_for if replica else sentinels.master_for
        client: redis.Redis = connect(target.service, db=target.db, **master)  # type: ignore[no-untyped-call]
        return client


def _secret(value: SecretStr | None, file: Path | None) -> str | None:
    if file is not None:
        secret = file.read_text().strip()
        register_secret(secret)  # read anew at each connect: a rotated one too
        return secret
    return value.get_secret_value() if value else None


def follow_failover(client: redis.Redis) -> None:
    """Behind Sentinel: ask for the master now; idle connections to a former one are closed
    (the next command opens one to the new master). Elsewhere nothing."""
    from redis.sentinel import SentinelConnectionPool

    pool = client.connection_pool
    if isinstance(pool, SentinelConnectionPool):
        pool.get_master_address()  # type: ignore[no-untyped-call]


def sever(client: redis.Redis | None) -> None:
    """From another thread: shut down every socket of the client's pool, in use or not.

    A call blocked on a hung server fails at once (a deadline passed, or shutdown); the next
    call opens a new connection."""
    if client is not None:
        client.connection_pool.disconnect(inuse_connections=True)


def is_cluster_state_error(error: BaseException) -> bool:
    """A Redis Cluster's answer about its slots or nodes, not about a key: MOVED or ASK (a slot
    resharded), TRYAGAIN, CLUSTERDOWN, or no node to be reached. The read is to be tried again
    later (with the slot map read again), never taken as a fault of the record it was for."""
    from redis.exceptions import (
        AskError,
        ClusterDownError,
        ClusterError,
        RedisClusterException,
        TryAgainError,
    )

    cluster_state = (AskError, ClusterDownError, ClusterError, RedisClusterException, TryAgainError)
    return isinstance(error, cluster_state)


def redis_error_reason(error: Exception) -> str:
    """A short, bounded label value for a Redis failure."""
    import redis
    from redis.sentinel import MasterNotFoundError

    if isinstance(error, redis.AuthenticationError | redis.exceptions.NoPermissionError):
        return "auth"
    if isinstance(error, MasterNotFoundError) and "AuthenticationError" in str(error):
        return "auth"  # every Sentinel refused our credentials
    if isinstance(error, redis.TimeoutError):
        return "timeout"
    if isinstance(error, redis.ConnectionError):
        return "connection"
    if isinstance(error, redis.ResponseError):
        return "response"
    return "other" if isinstance(error, redis.RedisError) else "internal"
