"""Real Redis topologies started by the tests: a master, its replica and three Sentinels."""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from pathlib import Path

import redis
import redis.cluster

from tests.claims import claim_port
from tests.conftest import wait_for
from tests.private_redis import PrivateRedis, ephemeral_low, free_port, is_free

SERVICE = "queues"


def _tls_server_args(tls: Path, port: int) -> tuple[str, ...]:
    """TLS on the server's port and to its master, plain TCP off (the later --port wins),
    clients asked for a certificate of the test CA."""
    return (
        *("--tls-port", str(port), "--port", "0"),
        *("--tls-replication", "yes", "--tls-auth-clients", "yes"),
        *("--tls-cert-file", str(tls / "server.crt"), "--tls-key-file", str(tls / "server.key")),
        *("--tls-ca-cert-file", str(tls / "ca.crt")),
    )


def _tls_client_options(tls: Path | None) -> dict[str, object]:
    if tls is None:
        return {}
    return {
        "ssl": True,
        "ssl_ca_certs": str(tls / "ca.crt"),
        "ssl_certfile": str(tls / "client.crt"),
        "ssl_keyfile": str(tls / "client.key"),
    }


class SentinelSetup:
    """A master, one replica and three Sentinels (quorum 2), each on a free port.
    `tls`: as ClusterSetup's; every server and Sentinel then speaks TLS only."""

    def __init__(
        self, directory: Path, sentinel_password: str | None = None, tls: Path | None = None
    ) -> None:
        self.directory = directory
        self.sentinel_password = sentinel_password
        self.tls = tls
        self.client_options = _tls_client_options(tls)
        self.master = PrivateRedis(self._dir("master"))
        self.replica = PrivateRedis(self._dir("replica"))
        if tls is not None:
            self.master.extra_args = _tls_server_args(tls, self.master.port)
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen[bytes]] = []

    def _dir(self, name: str) -> Path:
        path = self.directory / name
        path.mkdir(exist_ok=True)
        return path

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        scheme = "rediss+sentinel" if self.tls is not None else "redis+sentinel"
        return f"{scheme}://{hosts}/{SERVICE}/0"

    def start(self) -> SentinelSetup:
        try:
            return self._start()
        except BaseException:
            self.stop()  # no server outlives a setup that failed
            raise

    def _start(self) -> SentinelSetup:
        self.master.start()
        self.replica.extra_args = ("--replicaof", "127.0.0.1", str(self.master.port))
        if self.tls is not None:
            self.replica.extra_args += _tls_server_args(self.tls, self.replica.port)
        self.replica.start()
        for index, port in enumerate(self.sentinel_ports):
            config = self._dir(f"sentinel{index}") / "sentinel.conf"
            lines = [f"port {port}"]
            if self.tls is not None:  # the same options in a config file's form
                arguments = iter(_tls_server_args(self.tls, port))
                lines = [
                    f"{name[2:]} {value}" for name, value in zip(arguments, arguments, strict=True)
                ]
            lines += [
                "bind 127.0.0.1",
                f"dir {config.parent}",
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 2",
                # No test waits for a Sentinel to notice a server down (failovers are asked
                # for): at 1 s, a loaded machine's slow PING replies had the replica flagged
                # down, and redis-py's replica reads fell back to the master.
                f"sentinel down-after-milliseconds {SERVICE} 10000",
                f"sentinel failover-timeout {SERVICE} 3000",
            ]
            if self.sentinel_password:
                lines.append(f"requirepass {self.sentinel_password}")
            config.write_text("\n".join(lines) + "\n")
            binary = shutil.which("redis-server") or "redis-server"
            self.sentinels.append(
                subprocess.Popen(
                    [binary, str(config), "--sentinel"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        wait_for(self._replica_known, timeout=30)
        return self

    def sentinel_client(self, index: int = 0) -> redis.Redis:
        port = self.sentinel_ports[index]
        return redis.Redis(
            host="127.0.0.1",
            port=port,
            password=self.sentinel_password,
            socket_timeout=5,
            **self.client_options,
        )

    def master_port(self, sentinel: int = 0) -> int:
        """The master's port as a Sentinel (the first) sees it now."""
        with self.sentinel_client(sentinel) as client:
            _, port = client.sentinel_get_master_addr_by_name(SERVICE)
        return int(port)

    def _replica_known(self) -> bool:
        """Every Sentinel knows the replica, in sync, and the other Sentinels."""
        try:
            for index in range(len(self.sentinel_ports)):
                with self.sentinel_client(index) as client:
                    replicas = client.sentinel_slaves(SERVICE)
                    master = client.sentinel_master(SERVICE)
                ok = any(r["is_slave"] and not r["is_sdown"] for r in replicas)
                if not ok or master["num-other-sentinels"] < 2:
                    return False
        except (redis.RedisError, OSError):
            return False
        with self.master.client(**self.client_options) as client:
            info = client.info("replication")
        return bool(info.get("connected_slaves")) and info["slave0"]["state"] == "online"

    def failover(self, pause_writes_ms: int = 20000) -> int:
        """A failover that loses no acknowledged write: writes to the master are paused and the
        replica caught up (as Redis's own FAILOVER does), then SENTINEL FAILOVER; once every
        Sentinel names the replica as master, the old master is made its replica and its
        clients are cut off (the writes it held never run; retried, they go to the new master),
        then it is unpaused. Made a replica before it takes writes again: a client that asked
        a Sentinel not yet told and reached it is refused (READONLY) and tries again, where a
        write acknowledged there would be lost once the Sentinels made it a replica. Returns
        the new master's port."""
        old = self.master_port()
        with self.master.client() as master:
            master.execute_command("CLIENT", "PAUSE", pause_writes_ms, "WRITE")
            wait_for(lambda: _caught_up(master.info("replication")), timeout=10)
            with self.sentinel_client() as client:
                client.execute_command("SENTINEL", "FAILOVER", SERVICE)
            wait_for(lambda: self.master_port() != old, timeout=30)
            new = self.master_port()
            sentinels = range(len(self.sentinel_ports))
            wait_for(lambda: all(self.master_port(index) == new for index in sentinels), timeout=30)
            master.execute_command("REPLICAOF", "127.0.0.1", new)  # not a write: not paused
            master.execute_command("CLIENT", "KILL", "TYPE", "normal")
            master.execute_command("CLIENT", "UNPAUSE")
        return new

    def stop(self) -> None:
        for process in self.sentinels:
            process.kill()
            process.wait(timeout=10)
        self.replica.stop()
        self.master.stop()


def _caught_up(info: dict) -> bool:
    replica = info.get("slave0")
    return bool(replica) and replica["offset"] == info["master_repl_offset"]


def eventually(condition, timeout: float = 30.0):
    """wait_for, tolerating Redis errors while a topology changes."""

    def attempt():
        try:
            return condition()
        except (redis.RedisError, OSError):
            return None

    return wait_for(attempt, timeout=timeout)


def sleep_cycles(interval: float, cycles: int) -> None:
    time.sleep(interval * cycles)


def cluster_ports(count: int) -> list[int]:
    """Ports for `count` cluster nodes, each with its cluster bus port (port + 10000) free too,
    all of them distinct and below the ephemeral range. A bus port in that range (as one over
    30000 was) could be taken, between this choice and its node's start, as the local port of
    any process's outgoing connection; the node then failed to start. Both are claimed, so
    free_port(), which draws from the same range, does not hand them out. Drawn by a generator of their own: a test seeding `random` cannot repeat them."""
    below = max(ephemeral_low() - 10_000, 10_001)
    draw = random.SystemRandom()
    chosen: list[int] = []
    for _ in range(1000):
        port = draw.randrange(10_000, below)
        pair = {port, port + 10_000}
        taken = {*chosen, *(number + 10_000 for number in chosen)}
        free = not pair & taken and all(is_free(number) for number in pair)
        if free and claim_port(port) and claim_port(port + 10_000):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise RuntimeError("no free port pairs for the cluster's nodes")


class ClusterSetup:
    """A Redis Cluster of three primaries and three replicas, created by redis-cli.
    `tls`: a directory with ca.crt, server.crt/.key and client.crt/.key (tests/tls_certs.py):
    every node then speaks TLS only (clients, replication, cluster bus) and asks clients for a
    certificate of that CA."""

    def __init__(
        self, directory: Path, node_timeout_ms: int = 2000, tls: Path | None = None
    ) -> None:
        self.tls = tls
        self.client_options = _tls_client_options(tls)
        self.nodes = []
        for index, port in enumerate(cluster_ports(6)):
            path = directory / f"node{index}"
            path.mkdir(parents=True, exist_ok=True)
            self.nodes.append(
                PrivateRedis(
                    path,
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    str(path / "nodes.conf"),
                    "--cluster-node-timeout",
                    str(node_timeout_ms),
                    *(_tls_server_args(tls, port) if tls is not None else ()),
                    *(("--tls-cluster", "yes") if tls is not None else ()),
                    port=port,
                )
            )

    @property
    def url(self) -> str:
        scheme = "rediss+cluster" if self.tls is not None else "redis+cluster"
        return f"{scheme}://127.0.0.1:{self.nodes[0].port},127.0.0.1:{self.nodes[1].port}"

    def start(self) -> ClusterSetup:
        try:
            return self._start()
        except BaseException:
            self.stop()  # no server outlives a setup that failed
            raise

    def _start(self) -> ClusterSetup:
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        replicas = ["--cluster-replicas", "1", "--cluster-yes"]
        tls = []
        if self.tls is not None:
            tls = ["--tls", "--cacert", str(self.tls / "ca.crt")]
            tls += ["--cert", str(self.tls / "client.crt"), "--key", str(self.tls / "client.key")]
        subprocess.run(
            [
                shutil.which("redis-cli") or "redis-cli",
                *tls,
                "--cluster",
                "create",
                *addresses,
                *replicas,
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        wait_for(self.healthy, timeout=60)
        wait_for(self._replicas_in_sync, timeout=60)  # else a replica may refuse to take over
        return self

    def _replicas_in_sync(self) -> bool:
        links = []
        for node in self.nodes:
            with node.client(**self.client_options) as client:
                info = client.info("replication")
                slots = client.execute_command("CLUSTER", "SLOTS")
            if info["role"] == "slave":
                links.append(info.get("master_link_status") == "up")
            links.append(all(len(shard) == 4 for shard in slots))  # range, primary, replica
        return len(links) == 9 and all(links)

    def healthy(self) -> bool:
        """Every live node says the cluster is ok and knows a primary for every slot."""
        try:
            for node in self.nodes:
                if node.process is None:
                    continue
                with node.client(**self.client_options) as client:
                    if client.cluster("INFO")["cluster_state"] != "ok":
                        return False
        except (redis.RedisError, OSError):
            return False
        return True

    def client(self) -> redis.cluster.RedisCluster:
        return redis.cluster.RedisCluster(
            host="127.0.0.1",
            port=self.nodes[0].port,
            **self.client_options,
        )

    def primary_of(self, key: str) -> PrivateRedis:
        with self.client() as client:
            node = client.get_node_from_key(key)
        return next(node_ for node_ in self.nodes if node_.port == node.port)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
