"""Node configuration: one frozen `NodeConfig`, built from defaults, a TOML file, RAFTMQ_* variables and flags.

Every setting is declared once in `SETTINGS` (name, type, default, help). The same table drives the TOML
reader, the environment reader (`RAFTMQ_<NAME>` in upper case), the command-line flags (`--<name-with-dashes>`)
and the reference table in docs/configuration.md. Precedence, highest first: flags > environment > file >
embedded defaults. Values are checked here, so a bad value stops the node at start with a message naming the
setting, never later at run time.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cluster.authlink.amqp_login import RESERVED_USER_PREFIX, is_reserved_user
from cluster.metadata.membership import NodeEndpoints
from node.runtime.secret_strength import secret_weakness

ENV_PREFIX = "RAFTMQ_"
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class BootstrapUser:
    """A user created at first start (RabbitMQ's default_user), with full permissions on `vhost`."""

    name: str
    password: str
    tags: tuple[str, ...] = ("administrator",)
    vhost: str = "/"
    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Everything `raftmq node` needs; see docs/configuration.md for the meaning of each field."""

    node_name: str = "raftmq"
    listen_address: str = ""
    port: int = 5672
    data_dir: str = ""
    default_user: str = "guest"
    default_pass: str = "guest"
    default_vhost: str = "/"
    loopback_users: tuple[str, ...] = ("guest",)
    extra_users: tuple[BootstrapUser, ...] = ()
    static_shovels: tuple[tuple[str, str], ...] = ()  # (name, dynamic definition JSON): [shovels.NAME] tables
    frame_max: int = 131072
    channel_max: int = 2047
    heartbeat_s: int = 60
    max_message_size_bytes: int = 128 * MIB
    connection_max: int = 0
    proxy_protocol: bool = False
    proxy_protocol_port: int = 0
    ssl_port: int = 0
    ssl_proxy_protocol_port: int = 0
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    ssl_cacertfile: str = ""
    ssl_verify: str = "verify_none"
    ssl_fail_if_no_peer_cert: bool = False
    ssl_cert_login: bool = False
    ssl_cert_login_from: str = "distinguished_name"
    handshake_timeout_ms: int = 10_000
    output_buffer_high_bytes: int = 4 * MIB
    output_buffer_low_bytes: int = 1 * MIB
    write_timeout_ms: int = 30_000
    memory_high_watermark: float = 0.4
    memory_high_watermark_bytes: int = 0
    disk_free_limit_bytes: int = 50_000_000
    resource_probe_interval_ms: int = 1_000
    broker_tick_ms: int = 100
    queue_messages_in_memory_max: int = 10_000
    shutdown_timeout_ms: int = 5_000
    accept_backoff_ms_max: int = 1_000
    log_level: str = "info"
    test_signal_alarms: bool = False
    test_unsafe_confirm_before_fsync: bool = False
    test_drop_unsynced_on_kill: bool = False
    test_fsync_delay_ms: int = 0
    test_unsafe_confirm_before_commit: bool = False
    cluster_nodes: tuple[str, ...] = ()
    cluster_secret: str = ""
    raft_port: int = 0
    metadata_port: int = 0
    management_port: int = 0
    prometheus_port: int = 15692
    management_ssl_port: int = 0
    management_ssl_certfile: str = ""
    management_ssl_keyfile: str = ""
    management_ssl_cacertfile: str = ""
    management_ssl_verify: str = "verify_none"
    management_ssl_fail_if_no_peer_cert: bool = False
    prometheus_ssl_port: int = 0
    node_down_after_ms: int = 5_000
    proposal_timeout_ms: int = 10_000
    definition_timeout_ms: int = 30_000
    management_read_barrier_ms: int = 2_000
    mirror_trim_records: int = 2_000
    mirror_flush: str = "fsync"
    mirror_hw_checkpoint_ms: int = 1_000
    member_replace_after_ms: int = 0
    mirror_replace_after_ms: int = 5_000
    quorum_initial_group_size: int = 3

    @property
    def clustered(self) -> bool:
        """True when the node runs in cluster mode (`cluster_nodes` is set)."""
        return bool(self.cluster_nodes)

    def resolved_data_dir(self) -> Path:
        """The data directory: `data_dir` when set, else ./data/<node_name>."""
        return Path(self.data_dir) if self.data_dir else Path("data") / self.node_name

    def all_users(self) -> tuple[BootstrapUser, ...]:
        """The default user (if named) followed by the extra users of the config file."""
        users: list[BootstrapUser] = []
        if self.default_user:
            users.append(BootstrapUser(self.default_user, self.default_pass, ("administrator",), self.default_vhost))
        users.extend(self.extra_users)
        return tuple(users)


@dataclass(frozen=True, slots=True)
class Setting:
    """One row of the settings table."""

    name: str
    kind: str  # "str" | "int" | "float" | "bool" | "list"
    help: str
    flag_only: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)


SETTINGS: tuple[Setting, ...] = (
    Setting("node_name", "str", "Node name; names the default data directory and appears in logs."),
    Setting("listen_address", "str", "Address to listen on. Empty = every interface, IPv4 and IPv6 (as RabbitMQ)."),
    Setting("port", "int", "AMQP 0-9-1 port. 0 picks a free port (printed at start)."),
    Setting("data_dir", "str", "Directory for durable definitions and messages. Empty = ./data/<node_name>."),
    Setting("default_user", "str", "User created at start with full permissions on default_vhost. Empty = none."),
    Setting("default_pass", "str", "Password of default_user."),
    Setting("default_vhost", "str", "Virtual host created at start."),
    Setting("loopback_users", "list", "Users that may only connect from loopback (comma-separated in env/flags)."),
    Setting("frame_max", "int", "Largest frame offered in connection.tune, bytes (>= 4096)."),
    Setting("channel_max", "int", "Most channels per connection offered in connection.tune (1..65535)."),
    Setting("heartbeat_s", "int", "Heartbeat timeout offered in connection.tune, seconds (0 = off)."),
    Setting("max_message_size_bytes", "int", "Largest message body accepted; bigger publishes close the channel (406)."),
    Setting("connection_max", "int", "Most concurrent client connections (0 = no limit)."),
    Setting("proxy_protocol", "bool",
            "The AMQP listener (port, and ssl_port if set) requires a PROXY protocol v1/v2 header on every "
            "connection and takes the "
            "client's address from it (as RabbitMQ's proxy_protocol; for nodes behind HAProxy's send-proxy-v2)."),
    Setting("proxy_protocol_port", "int",
            "An extra AMQP listener on listen_address that requires a PROXY protocol header (0 = none); "
            "`raftmq cluster up` points HAProxy at it."),
    Setting("ssl_port", "int",
            "amqps (AMQP over TLS) listener on listen_address, as RabbitMQ's listeners.ssl.default (usually 5671; "
            "0 = none). Needs ssl_certfile and ssl_keyfile. With proxy_protocol it requires the PROXY header too."),
    Setting("ssl_proxy_protocol_port", "int",
            "An extra amqps listener that requires a PROXY protocol header before the TLS handshake (0 = none); "
            "`raftmq cluster up --tls` points HAProxy's TLS passthrough frontend at it."),
    Setting("ssl_certfile", "str", "amqps: the node's certificate (PEM; may hold the chain), as ssl_options.certfile."),
    Setting("ssl_keyfile", "str", "amqps: the private key of ssl_certfile (PEM, unencrypted), as ssl_options.keyfile."),
    Setting("ssl_cacertfile", "str",
            "amqps: CA certificates (PEM) that client certificates are checked against, as ssl_options.cacertfile."),
    Setting("ssl_verify", "str",
            "amqps: verify_none (no client certificate asked for) or verify_peer (asked for and checked if given), "
            "as ssl_options.verify."),
    Setting("ssl_fail_if_no_peer_cert", "bool",
            "amqps with verify_peer: refuse a client without a certificate, as ssl_options.fail_if_no_peer_cert."),
    Setting("ssl_cert_login", "bool",
            "amqps: offer the EXTERNAL SASL mechanism to a client whose certificate was verified; it logs in as the "
            "user the certificate names, without a password (as rabbitmq_auth_mechanism_ssl)."),
    Setting("ssl_cert_login_from", "str",
            "EXTERNAL login name: distinguished_name (the subject in RFC 4514 form, e.g. CN=app,O=org) or "
            "common_name (the subject's CN), as ssl_cert_login_from."),
    Setting("handshake_timeout_ms", "int", "Time a client has to finish the AMQP handshake (and the TLS one on amqps)."),
    Setting("output_buffer_high_bytes", "int", "Per-connection output above which deliveries to it pause."),
    Setting("output_buffer_low_bytes", "int", "Per-connection output below which deliveries resume."),
    Setting("write_timeout_ms", "int", "A socket write stuck longer than this closes the connection."),
    Setting("memory_high_watermark", "float", "Memory alarm threshold as a fraction of total RAM (RabbitMQ: 0.4)."),
    Setting("memory_high_watermark_bytes", "int", "Absolute memory alarm threshold; overrides the fraction if > 0."),
    Setting("disk_free_limit_bytes", "int", "Disk alarm when free space on the data dir falls below this."),
    Setting("resource_probe_interval_ms", "int", "How often memory and disk are probed."),
    Setting("broker_tick_ms", "int", "Period of the broker timer (message TTL, queue expiry)."),
    Setting("queue_messages_in_memory_max", "int",
            "Messages a single-node queue keeps in memory; past it the backlog stays on disk (0 = no paging)."),
    Setting("shutdown_timeout_ms", "int", "Graceful shutdown: time clients get to answer connection.close."),
    Setting("accept_backoff_ms_max", "int", "Longest pause of accept when file descriptors run out."),
    Setting("log_level", "str", "debug, info, warning or error."),
    Setting("test_signal_alarms", "bool", "Testing only: SIGUSR1/SIGUSR2 toggle a forced memory/disk alarm."),
    Setting("test_unsafe_confirm_before_fsync", "bool",
            "Testing only, UNSAFE: publisher confirms leave before the fsync, so a crash loses confirmed messages."),
    Setting("test_drop_unsynced_on_kill", "bool",
            "Testing only: at start, cut the log's files back to their last fsync (simulates losing the page cache)."),
    Setting("test_fsync_delay_ms", "int",
            "Testing only: a slow disk; each commit writes its batch, waits this long, then fsyncs (0 = off)."),
    Setting("test_unsafe_confirm_before_commit", "bool",
            "Testing only, UNSAFE, cluster mode: a node applies its own publishes to its replica before Raft commits "
            "them, so confirms leave before a majority has the message."),
    Setting("cluster_nodes", "list",
            "Cluster mode: every node as name=host:amqp_port[:raft_port[:metadata_port]], this node included "
            "(comma-separated). Empty = single node."),
    Setting("cluster_secret", "str",
            "Cluster mode: shared secret authenticating Raft and metadata peers (>= 16 bytes and >= 128 bits "
            "estimated; placeholders refused)."),
    Setting("raft_port", "int", "Queue Raft port, the same on every node. 0 = each node's AMQP port + 20000."),
    Setting("metadata_port", "int", "Metadata Raft port, the same on every node. 0 = each node's AMQP port + 21000."),
    Setting("management_port", "int", "Management HTTP port. 0 = AMQP port + 10000."),
    Setting("prometheus_port", "int", "Prometheus metrics port (GET /metrics, RabbitMQ's 15692). 0 = off."),
    Setting("management_ssl_port", "int",
            "Management API over HTTPS on this port, as RabbitMQ's management.ssl.port (usually 15671; 0 = none). "
            "Served besides the HTTP port. Needs management_ssl_certfile and management_ssl_keyfile."),
    Setting("management_ssl_certfile", "str", "HTTPS management (and Prometheus): the certificate (PEM; may hold the "
            "chain), as management.ssl.certfile."),
    Setting("management_ssl_keyfile", "str", "HTTPS management: the private key (PEM, unencrypted), as "
            "management.ssl.keyfile."),
    Setting("management_ssl_cacertfile", "str", "HTTPS management: CA certificates (PEM) client certificates are "
            "checked against, as management.ssl.cacertfile."),
    Setting("management_ssl_verify", "str", "HTTPS management: verify_none | verify_peer (ask for a client "
            "certificate), as management.ssl.verify."),
    Setting("management_ssl_fail_if_no_peer_cert", "bool", "HTTPS management with verify_peer: refuse a client "
            "without a certificate, as management.ssl.fail_if_no_peer_cert."),
    Setting("prometheus_ssl_port", "int", "Prometheus metrics over HTTPS on this port, with the management_ssl_* "
            "certificate settings, as prometheus.ssl.port (usually 15691; 0 = none)."),
    Setting("node_down_after_ms", "int", "Cluster mode: a peer unreachable this long is reported down."),
    Setting("proposal_timeout_ms", "int", "Cluster mode: a queue command not applied within this is given up (publish nacked)."),
    Setting("definition_timeout_ms", "int", "Cluster mode: a definition change (declare, bind, user, policy...) not "
            "committed by the metadata group within this is given up (the client gets 541, the API 503)."),
    Setting("management_read_barrier_ms", "int", "Cluster mode: a management request that reads or changes "
            "definitions first waits up to this for a metadata read barrier, so it sees every change committed "
            "through any node before it; after it, it is answered from this node's copy (header X-Raftmq-Metadata: "
            "unconfirmed). 0 = no barrier (reads may miss a change made through another node a moment before)."),
    Setting("mirror_trim_records", "int", "Cluster mode: a mirrored queue replica snapshots its queue and drops its "
            "log prefix once this many applied records are above the log start."),
    Setting("mirror_flush", "str", "Cluster mode: mirrored queue replicas' flush policy: fsync (every append on disk "
            "before it counts) or unsynced (UNSAFE, for the failure scenarios: appends stay in the process, as in "
            "Kafka's page cache, written back every second; a crash loses them, confirmed messages included)."),
    Setting("mirror_hw_checkpoint_ms", "int", "Cluster mode: a mirrored queue replica writes its high watermark "
            "checkpoint this often (a restart starts from it; `ha-truncation: hw` cuts the log to it). Large values "
            "only for the failure scenarios (a stale checkpoint)."),
    Setting("member_replace_after_ms", "int",
            "Cluster mode: a quorum member down this long is replaced by an up non-member (0 = never, as RabbitMQ)."),
    Setting("mirror_replace_after_ms", "int",
            "Cluster mode: a mirrored queue replica (ha-mode exactly) down this long is replaced by an up node outside "
            "its replica set (0 = never; RabbitMQ replaces at once)."),
    Setting("quorum_initial_group_size", "int", "Default voters of a new quorum queue (x-quorum-initial-group-size)."),
)

_SETTINGS_BY_NAME = {s.name: s for s in SETTINGS}


class ConfigError(ValueError):
    """A setting has a bad value or an unknown name; the message says which."""


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _parse_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


_FROM_TEXT: dict[str, Callable[[str], Any]] = {
    "str": str,
    "int": int,
    "float": float,
    "bool": _parse_bool,
    "list": _parse_list,
}


def _coerce(setting: Setting, value: Any, origin: str) -> Any:
    """Turn a raw value (text from env/flags, or a TOML value) into the setting's type."""
    try:
        if isinstance(value, str):
            return _FROM_TEXT[setting.kind](value)
        if setting.kind == "list" and isinstance(value, list):
            return tuple(str(v) for v in value)
        if setting.kind == "float" and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if setting.kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return value
        if setting.kind == "bool" and isinstance(value, bool):
            return value
    except ValueError as exc:
        raise ConfigError(f"{origin}: {setting.name}: {exc}") from None
    raise ConfigError(f"{origin}: {setting.name}: expected {setting.kind}, got {value!r}")


def _users_from_toml(raw: Any, origin: str) -> tuple[BootstrapUser, ...]:
    if not isinstance(raw, list):
        raise ConfigError(f"{origin}: users must be an array of tables ([[users]])")
    users = []
    for entry in raw:
        if not isinstance(entry, dict) or "name" not in entry or "password" not in entry:
            raise ConfigError(f"{origin}: each [[users]] needs name and password")
        tags = tuple(str(t) for t in entry.get("tags", ()))
        users.append(BootstrapUser(
            str(entry["name"]), str(entry["password"]), tags, str(entry.get("vhost", "/")),
            str(entry.get("configure", ".*")), str(entry.get("write", ".*")), str(entry.get("read", ".*")),
        ))
    return tuple(users)


def _shovels_from_toml(raw: Any, origin: str) -> tuple[tuple[str, str], ...]:
    from cluster.shovel.params import ShovelParamError
    from cluster.shovel.static import static_definition

    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: shovels must be tables ([shovels.NAME])")
    try:
        return tuple((str(name), static_definition(str(name), table)) for name, table in sorted(raw.items()))
    except ShovelParamError as exc:
        raise ConfigError(f"{origin}: {exc}") from None


def values_from_toml(path: Path) -> dict[str, Any]:
    """Read a TOML file: top-level keys are setting names; `[[users]]` tables add users; `[shovels.NAME]` tables
    are static shovels (cluster/shovel/static.py)."""
    try:
        with path.open("rb") as handle:
            raw = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "users":
            values["extra_users"] = _users_from_toml(value, str(path))
            continue
        if key == "shovels":
            values["static_shovels"] = _shovels_from_toml(value, str(path))
            continue
        setting = _SETTINGS_BY_NAME.get(key)
        if setting is None:
            raise ConfigError(f"{path}: unknown setting {key!r}")
        values[key] = _coerce(setting, value, str(path))
    return values


def values_from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """RAFTMQ_<SETTING> variables; unknown RAFTMQ_ names are ignored except RAFTMQ_CONFIG_FILE."""
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        name = ENV_PREFIX + setting.name.upper()
        if name in environ:
            values[setting.name] = _coerce(setting, environ[name], f"${name}")
    return values


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raftmq node", description="Run one raftmq broker node.")
    parser.add_argument("--config", "-c", help="TOML configuration file (or $RAFTMQ_CONFIG_FILE)")
    parser.add_argument("--print-config", action="store_true", help="print the effective configuration and exit")
    for setting in SETTINGS:
        flag = "--" + setting.name.replace("_", "-")
        parser.add_argument(flag, dest=setting.name, default=None, help=setting.help)
    return parser


def values_from_flags(namespace: argparse.Namespace) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        raw = getattr(namespace, setting.name)
        if raw is not None:
            values[setting.name] = _coerce(setting, raw, "--" + setting.name.replace("_", "-"))
    return values


def validate(config: NodeConfig) -> NodeConfig:
    """Check ranges; raise ConfigError naming the first bad setting."""
    checks: list[tuple[bool, str]] = [
        (0 <= config.port <= 65535, "port must be 0..65535"),
        (config.frame_max >= 4096, "frame_max must be >= 4096"),
        (1 <= config.channel_max <= 65535, "channel_max must be 1..65535"),
        (0 <= config.heartbeat_s <= 65535, "heartbeat_s must be 0..65535"),
        (0 < config.max_message_size_bytes <= 512 * MIB, "max_message_size_bytes must be 1..536870912"),
        (config.connection_max >= 0, "connection_max must be >= 0"),
        (0 <= config.proxy_protocol_port <= 65535, "proxy_protocol_port must be 0..65535"),
        (0 <= config.ssl_port <= 65535, "ssl_port must be 0..65535"),
        (not config.ssl_port or bool(config.ssl_certfile and config.ssl_keyfile),
         "ssl_port needs ssl_certfile and ssl_keyfile"),
        (0 <= config.ssl_proxy_protocol_port <= 65535, "ssl_proxy_protocol_port must be 0..65535"),
        (not config.ssl_proxy_protocol_port or bool(config.ssl_certfile and config.ssl_keyfile),
         "ssl_proxy_protocol_port needs ssl_certfile and ssl_keyfile"),
        (config.ssl_verify in ("verify_none", "verify_peer"), "ssl_verify must be verify_none|verify_peer"),
        (config.ssl_verify == "verify_none" or bool(config.ssl_cacertfile), "ssl_verify = verify_peer needs ssl_cacertfile"),
        (not config.ssl_fail_if_no_peer_cert or config.ssl_verify == "verify_peer",
         "ssl_fail_if_no_peer_cert needs ssl_verify = verify_peer"),
        (not config.ssl_cert_login or config.ssl_verify == "verify_peer", "ssl_cert_login needs ssl_verify = verify_peer"),
        (config.ssl_cert_login_from in ("distinguished_name", "common_name"),
         "ssl_cert_login_from must be distinguished_name|common_name"),
        (config.handshake_timeout_ms > 0, "handshake_timeout_ms must be > 0"),
        (0 < config.output_buffer_low_bytes < config.output_buffer_high_bytes,
         "need 0 < output_buffer_low_bytes < output_buffer_high_bytes"),
        (config.write_timeout_ms > 0, "write_timeout_ms must be > 0"),
        (0.0 <= config.memory_high_watermark <= 1.0, "memory_high_watermark must be 0..1"),
        (config.memory_high_watermark_bytes >= 0, "memory_high_watermark_bytes must be >= 0"),
        (config.disk_free_limit_bytes >= 0, "disk_free_limit_bytes must be >= 0"),
        (config.resource_probe_interval_ms > 0, "resource_probe_interval_ms must be > 0"),
        (config.broker_tick_ms > 0, "broker_tick_ms must be > 0"),
        (config.queue_messages_in_memory_max >= 0, "queue_messages_in_memory_max must be >= 0"),
        (config.shutdown_timeout_ms >= 0, "shutdown_timeout_ms must be >= 0"),
        (config.accept_backoff_ms_max > 0, "accept_backoff_ms_max must be > 0"),
        (0 <= config.test_fsync_delay_ms <= 60_000, "test_fsync_delay_ms must be 0..60000"),
        (config.log_level in ("debug", "info", "warning", "error"), "log_level must be debug|info|warning|error"),
        (bool(config.node_name), "node_name must not be empty"),
        (0 <= config.raft_port <= 65535, "raft_port must be 0..65535"),
        (0 <= config.metadata_port <= 65535, "metadata_port must be 0..65535"),
        (0 <= config.management_port <= 65535, "management_port must be 0..65535"),
        (0 <= config.prometheus_port <= 65535, "prometheus_port must be 0..65535"),
        (0 <= config.management_ssl_port <= 65535, "management_ssl_port must be 0..65535"),
        (0 <= config.prometheus_ssl_port <= 65535, "prometheus_ssl_port must be 0..65535"),
        (not (config.management_ssl_port or config.prometheus_ssl_port)
         or bool(config.management_ssl_certfile and config.management_ssl_keyfile),
         "management_ssl_port and prometheus_ssl_port need management_ssl_certfile and management_ssl_keyfile"),
        (config.management_ssl_verify in ("verify_none", "verify_peer"),
         "management_ssl_verify must be verify_none|verify_peer"),
        (config.management_ssl_verify == "verify_none" or bool(config.management_ssl_cacertfile),
         "management_ssl_verify = verify_peer needs management_ssl_cacertfile"),
        (not config.management_ssl_fail_if_no_peer_cert or config.management_ssl_verify == "verify_peer",
         "management_ssl_fail_if_no_peer_cert needs management_ssl_verify = verify_peer"),
        (config.node_down_after_ms > 0, "node_down_after_ms must be > 0"),
        (config.proposal_timeout_ms > 0, "proposal_timeout_ms must be > 0"),
        (config.definition_timeout_ms > 0, "definition_timeout_ms must be > 0"),
        (config.management_read_barrier_ms >= 0, "management_read_barrier_ms must be >= 0"),
        (config.member_replace_after_ms >= 0, "member_replace_after_ms must be >= 0"),
        (config.mirror_trim_records > 0, "mirror_trim_records must be > 0"),
        (config.mirror_replace_after_ms >= 0, "mirror_replace_after_ms must be >= 0"),
        (config.mirror_flush in ("fsync", "unsynced"), "mirror_flush must be fsync|unsynced"),
        (config.mirror_hw_checkpoint_ms > 0, "mirror_hw_checkpoint_ms must be > 0"),
        (not config.test_unsafe_confirm_before_commit or bool(config.cluster_nodes),
         "test_unsafe_confirm_before_commit needs cluster mode (cluster_nodes)"),
        (config.quorum_initial_group_size >= 1, "quorum_initial_group_size must be >= 1"),
        (not any(is_reserved_user(u.name) for u in config.all_users()),
         f"user names starting with {RESERVED_USER_PREFIX!r} are the nodes' internal logins (default_user, users)"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    if config.clustered:
        cluster_layout(config)  # raises ConfigError naming what is wrong
    return config


# One node of the cluster with every port it serves (derived from its AMQP port unless set): the same value the
# metadata records for a node, so a configured member and a joined one are one type.
ClusterMember = NodeEndpoints


@dataclass(frozen=True, slots=True)
class ClusterLayout:
    """The parsed cluster settings: this node's name, every member (in `cluster_nodes` order), the secret."""

    self_name: str
    members: tuple[ClusterMember, ...]
    secret: str

    @property
    def me(self) -> ClusterMember:
        return next(m for m in self.members if m.name == self.self_name)

    @property
    def peers(self) -> tuple[ClusterMember, ...]:
        return tuple(m for m in self.members if m.name != self.self_name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members)


RAFT_PORT_OFFSET = 20_000
METADATA_PORT_OFFSET = 21_000
MANAGEMENT_PORT_OFFSET = 10_000


def _derived_port(explicit: int, amqp_port: int, offset: int, what: str) -> int:
    port = explicit or amqp_port + offset
    if not 0 < port <= 65535:
        raise ConfigError(f"cluster_nodes: derived {what} port {port} is out of range; set {what}_port")
    return port


def _port(text: str, entry: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise ConfigError(f"cluster_nodes: {entry!r}: bad port {text!r}") from None
    if not 0 < port <= 65535:
        raise ConfigError(f"cluster_nodes: {entry!r}: port must be 1..65535")
    return port


def _parse_member(entry: str, config: NodeConfig) -> ClusterMember:
    """`name=host:amqp_port`, optionally followed by `:raft_port` and `:metadata_port` (then those win)."""
    name, sep, address = entry.partition("=")
    name, address = name.strip(), address.strip()
    if address.startswith("["):  # [IPv6]:ports
        host, _, ports_text = address[1:].partition("]:")
    else:
        host, _, ports_text = address.partition(":")
    ports = [_port(p, entry) for p in ports_text.split(":")] if ports_text else []
    if not sep or not name or not host or not 1 <= len(ports) <= 3:
        raise ConfigError(f"cluster_nodes: {entry!r} is not name=host:amqp_port[:raft_port[:metadata_port]]")
    amqp_port = ports[0]
    raft = ports[1] if len(ports) > 1 else _derived_port(config.raft_port, amqp_port, RAFT_PORT_OFFSET, "raft")
    metadata = ports[2] if len(ports) > 2 else _derived_port(config.metadata_port, amqp_port,
                                                             METADATA_PORT_OFFSET, "metadata")
    management = config.management_port if name == config.node_name else 0
    return ClusterMember(name, host, amqp_port, raft, metadata,
                         _derived_port(management, amqp_port, MANAGEMENT_PORT_OFFSET, "management"))


def cluster_layout(config: NodeConfig) -> ClusterLayout:
    """Parse `cluster_nodes` (name=host:amqp_port, this node included) and check the cluster settings."""
    members = tuple(_parse_member(entry, config) for entry in config.cluster_nodes)
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        raise ConfigError("cluster_nodes: node names must be distinct")
    if config.node_name not in names:
        raise ConfigError(f"cluster_nodes must include this node ({config.node_name!r})")
    weakness = secret_weakness(config.cluster_secret)
    if weakness is not None:
        raise ConfigError(
            f"cluster_secret refused: {weakness}. Use a long random secret, the same on every node, e.g. "
            "`python3 -c 'import secrets; print(secrets.token_hex(32))'` (docs/configuration.md, \"Cluster secret\")")
    return ClusterLayout(config.node_name, members, config.cluster_secret)


def load(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> tuple[NodeConfig, argparse.Namespace]:
    """Build the effective configuration: defaults < file < environment < flags."""
    env = os.environ if environ is None else environ
    namespace = build_arg_parser().parse_args(list(argv))
    config_path = namespace.config or env.get(ENV_PREFIX + "CONFIG_FILE")
    values: dict[str, Any] = {}
    if config_path:
        values.update(values_from_toml(Path(config_path)))
    values.update(values_from_env(env))
    values.update(values_from_flags(namespace))
    return validate(dataclasses.replace(NodeConfig(), **values)), namespace


def describe(config: NodeConfig) -> str:
    """The effective configuration as TOML-ish text (passwords hidden)."""
    lines = []
    for setting in SETTINGS:
        value = getattr(config, setting.name)
        if setting.name == "cluster_secret" and not value:
            continue  # single-node mode: nothing to hide, nothing to show
        if setting.name in ("default_pass", "cluster_secret"):
            value = "********"
        lines.append(f"{setting.name} = {value!r}")
    return "\n".join(lines)


def reference_table() -> str:
    """The markdown table of docs/configuration.md (kept in sync by a test)."""
    defaults = NodeConfig()
    rows = ["| setting | environment | flag | type | default | meaning |", "| --- | --- | --- | --- | --- | --- |"]
    for s in SETTINGS:
        default = getattr(defaults, s.name)
        shown = ",".join(default) if isinstance(default, tuple) else str(default)
        shown = f"`{shown}`" if shown else "(empty)"
        rows.append(
            f"| `{s.name}` | `{ENV_PREFIX}{s.name.upper()}` | `--{s.name.replace('_', '-')}` | {s.kind} "
            f"| {shown} | {s.help} |"
        )
    return "\n".join(rows)
