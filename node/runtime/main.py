"""`raftmq node`: read the configuration, open storage, recover the broker and serve until SIGTERM/SIGINT.

Start-up order: configuration (flags > RAFTMQ_* environment > TOML file > defaults), logging, the data directory
and its NodeLog, `Broker(config)` fed with every recovered record, then the trio server. The line
"raftmq node <name> listening on port <p>" on stderr tells scripts (and the test fixture) the node serves.
Exit codes: 0 after a graceful shutdown, 2 for a configuration error, 1 if the node could not start.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from functools import partial
from typing import Any

from node.runtime.config import ConfigError, NodeConfig, describe, load

log = logging.getLogger("raftmq.node")


def build_broker(config: NodeConfig, boot_id: int = 0) -> Any:
    """The pure broker, configured from the node config; bootstrap users are (re)created at every start.
    `boot_id` > 0: cluster mode (a replicated broker named after the node)."""
    from cluster.authlink.amqp_login import link_login  # amqp:// shovels and federation links log in with it
    from node.broker.auth import Permission
    from node.broker.broker import Broker, BrokerConfig  # the broker layer, imported when the node starts

    cluster: dict[str, Any] = {}
    if boot_id:
        from cluster.authlink.amqp_login import internal_login  # (forwarding between nodes logs in with it)

        cluster = {"node_name": config.node_name, "boot_id": boot_id, "replicated": True,
                   "internal_login": internal_login(config.cluster_secret)}
    broker = Broker(BrokerConfig(
        default_vhost=config.default_vhost,
        default_user=config.default_user,
        default_pass=config.default_pass,
        loopback_users=frozenset(config.loopback_users),
        rng=os.urandom,
        queue_messages_in_memory_max=config.queue_messages_in_memory_max,
        link_login=link_login(os.urandom(32)),  # a key of this process only: links connect to this node alone
        **cluster,
    ))  # the message size limit is enforced by the protocol layer (ConnectionLimits.max_message_size)
    for user in config.extra_users:
        broker.add_vhost(user.vhost)
        broker.add_user(user.name, user.password, user.tags)
        broker.set_permissions(user.name, user.vhost, Permission(user.configure, user.write, user.read))
    broker.take_effects()  # bootstrap definitions come from the config, not from storage
    return broker


async def _serve(config: NodeConfig) -> None:
    import trio

    from node.runtime.probes import ResourceProbe
    from node.runtime.server import Node, run_node
    from node.runtime.store import Store

    data_dir = config.resolved_data_dir()
    if config.test_unsafe_confirm_before_fsync:
        log.warning("TEST-ONLY UNSAFE MODE test_unsafe_confirm_before_fsync: publisher confirms are sent BEFORE "
                    "the data is fsynced; a crash loses confirmed messages. Never use this outside tests.")
    if config.test_drop_unsynced_on_kill:
        log.warning("TEST-ONLY MODE test_drop_unsynced_on_kill: at start, writes not fsynced before the last "
                    "stop are dropped from %s. Never use this outside tests.", data_dir)
    if config.test_fsync_delay_ms:
        log.warning("TEST-ONLY MODE test_fsync_delay_ms: every commit waits %d ms before its fsync.",
                    config.test_fsync_delay_ms)
    store = Store.open(data_dir, unsafe_confirm_before_fsync=config.test_unsafe_confirm_before_fsync,
                       drop_unsynced_on_kill=config.test_drop_unsynced_on_kill,
                       fsync_delay_s=config.test_fsync_delay_ms / 1000)
    broker = build_broker(config)
    records = store.recover()
    effects = broker.recover(records) if records else []
    node = Node(config, broker, store, ResourceProbe(config, data_dir))
    node.limits = dataclasses.replace(node.limits, cluster_name=config.node_name)  # (federation's loop check)
    node.apply_effects(effects)
    async with trio.open_nursery() as nursery:
        async with trio.open_nursery() as server:
            ports = await server.start(run_node, node)
            print(f"raftmq node {config.node_name} listening on port {ports[0]}", file=sys.stderr, flush=True)
            _print_proxy_listener(node, config)
            log.info("data dir %s; %d records recovered", data_dir, len(records))
            from node.runtime.management_view import BrokerView

            view = BrokerView(broker, node.dispatch, node_name=config.node_name, amqp_port=ports[0],
                              wait_durable=store.wait_durable)
            await _start_management(nursery, view, config, management_port(config, config.port), node)
            await _start_shovels(nursery, view, config, ports[0], broker.config.link_login, ownership=None)
        nursery.cancel_scope.cancel()


def _print_proxy_listener(node: Any, config: NodeConfig) -> None:
    if config.proxy_protocol:
        log.info("the AMQP listener requires a PROXY protocol header (proxy_protocol)")
    if node.proxy_ports:
        print(f"raftmq node {config.node_name} PROXY protocol listener on port {node.proxy_ports[0]}",
              file=sys.stderr, flush=True)
    if node.tls_ports:
        print(f"raftmq node {config.node_name} amqps listener on port {node.tls_ports[0]}", file=sys.stderr, flush=True)
    if node.tls_proxy_ports:
        print(f"raftmq node {config.node_name} amqps PROXY protocol listener on port {node.tls_proxy_ports[0]}",
              file=sys.stderr, flush=True)


def management_port(config: NodeConfig, amqp_port: int) -> int:
    """`management_port`, else derived (AMQP port + 10000, docs/cluster.md); 0 (a free port) when the AMQP port
    was 0 or the derived one would be out of range."""
    from node.runtime.config import MANAGEMENT_PORT_OFFSET

    if config.management_port:
        return config.management_port
    derived = amqp_port + MANAGEMENT_PORT_OFFSET
    return derived if amqp_port and derived <= 65535 else 0


async def _start_management(nursery: Any, view: Any, config: NodeConfig, port: int, node: Any) -> None:
    """The management HTTP API (node/runtime/management.py) and the Prometheus listener (`prometheus_port`,
    metrics.py). A port that cannot be bound is logged and the node serves AMQP without it, rather than refusing
    to start."""
    from node.runtime.management import serve_management

    view.counters, view.probe = node, node.probe
    view.management_port = port or None
    view.more_listeners.extend(("amqp/ssl", p) for p in getattr(node, "tls_ports", ())[:1])  # (overview listeners)
    try:
        bound = await nursery.start(serve_management, view, config.listen_address, port)
    except OSError as exc:
        log.error("management API not started: cannot listen on port %d: %s", port, exc)
    else:
        view.management_port = bound
        print(f"raftmq node {config.node_name} management API on port {bound}", file=sys.stderr, flush=True)
    if config.prometheus_port:  # after the management API, which clients wait for
        try:
            bound = await nursery.start(partial(serve_management, view, config.listen_address, config.prometheus_port,
                                                metrics_only=True))
        except OSError as exc:
            log.error("Prometheus metrics not served: cannot listen on port %d: %s", config.prometheus_port, exc)
        else:
            view.more_listeners.append(("http/prometheus", bound))
    await _start_https(nursery, view, config)


async def _start_https(nursery: Any, view: Any, config: NodeConfig) -> None:
    """Management and Prometheus over HTTPS (`management_ssl_port`, `prometheus_ssl_port`; node/runtime/tls.py)."""
    from node.runtime.management import serve_management
    from node.runtime.tls import management_context

    for port, metrics_only, what, protocol in (
            (config.management_ssl_port, False, "management API (HTTPS)", "https"),
            (config.prometheus_ssl_port, True, "Prometheus metrics (HTTPS)", "https/prometheus")):
        if not port:
            continue
        try:
            bound = await nursery.start(partial(serve_management, view, config.listen_address, port,
                                                metrics_only=metrics_only, ssl_context=management_context(config)))
        except OSError as exc:
            log.error("%s not served: cannot listen on port %d: %s", what, port, exc)
        else:
            view.more_listeners.append((protocol, bound))  # (as RabbitMQ's overview lists them)
            print(f"raftmq node {config.node_name} {what} on port {bound}", file=sys.stderr, flush=True)


async def _start_shovels(nursery: Any, view: Any, config: NodeConfig, amqp_port: int, login: tuple[str, str],
                         ownership: Any) -> None:
    """Dynamic shovels (cluster/shovel/manager.py) and exchange federation links (cluster/federation/manager.py):
    the definitions come from the view (broker parameters, or the cluster metadata); `amqp://` with no host is this
    node, logged in with the links' own `login` (cluster/authlink/amqp_login.py: no user of the user table). In a
    cluster, `ownership` (cluster/link/ownership.py) says what runs here."""
    from cluster.link.uri import AmqpUri
    from cluster.shovel.manager import ShovelManager

    host = config.listen_address if config.listen_address not in ("", "0.0.0.0", "::") else "127.0.0.1"
    local = AmqpUri(host=host, port=amqp_port, username=login[0], password=login[1])

    async def delete_definition(vhost: str, name: str) -> None:
        await view.clear_parameter("shovel", vhost, name)

    owner = ownership.owner_for("shovel") if ownership is not None else None
    view.shovels = ShovelManager(config.node_name, view.stored_shovels, owner, local, delete_definition)
    await nursery.start(view.shovels.run)
    from cluster.federation.manager import FederationManager

    if config.static_shovels:  # the config file's [shovels.NAME]: run like dynamic ones, leased apart from them
        statics = {("/", name): value for name, value in config.static_shovels}
        owner = ownership.owner_for("static-shovel") if ownership is not None else None
        view.static_shovels = ShovelManager(config.node_name, lambda: statics, owner, local, shovel_type="static")
        await nursery.start(view.static_shovels.run)
    owner = ownership.owner_for("federation") if ownership is not None else None
    view.federation = FederationManager(config.node_name, view.cluster_name, view, owner, local)
    await nursery.start(view.federation.run)
    if ownership is not None:
        ownership.on_change += [view.shovels.poke, view.federation.poke]
        ownership.busy["shovel"] = view.shovels.running_here
        ownership.busy["federation"] = view.federation.running_here
        if view.static_shovels is not None:
            ownership.busy["static-shovel"] = view.static_shovels.running_here
        await nursery.start(ownership.run)


async def _serve_cluster(config: NodeConfig) -> None:
    """Cluster mode (docs/cluster.md): metadata store, definitions mirrored, Raft groups, then the AMQP listener."""
    import time

    import trio

    from node.runtime.cluster.runtime import ClusterRuntime, bootstrap_records
    from node.runtime.config import cluster_layout
    from node.runtime.probes import ResourceProbe
    from node.runtime.server import Node, run_node

    layout = cluster_layout(config)
    config = dataclasses.replace(config, port=layout.me.amqp_port)
    boot_id = int(time.time() * 1000)
    broker = build_broker(config, boot_id)
    cluster = ClusterRuntime(config, layout, broker, boot_id)
    data_dir = config.resolved_data_dir()
    data_dir.mkdir(parents=True, exist_ok=True)
    node = Node(config, broker, cluster, ResourceProbe(config, data_dir))
    node.limits = dataclasses.replace(node.limits, cluster_name=",".join(layout.names))  # (the view's cluster_name)
    cluster.attach(node)
    await cluster.start(bootstrap_records(config))  # a wrong secret or version raises here, before any change
    async with trio.open_nursery() as nursery:
        await nursery.start(cluster.run)
        async with trio.open_nursery() as server:
            ports = await server.start(run_node, node)
            print(f"raftmq node {config.node_name} listening on port {ports[0]}", file=sys.stderr, flush=True)
            _print_proxy_listener(node, config)
            log.info("cluster node %s (boot %d); data dir %s; %d queues", config.node_name, boot_id, data_dir,
                     len(cluster.group_queues))
            from node.runtime.cluster.view import ClusterView

            view = ClusterView(cluster, node_name=config.node_name, amqp_port=ports[0],
                               cluster_name=",".join(layout.names))
            await _start_management(nursery, view, config, layout.me.management_port, node)
            from cluster.link.ownership import LeaseOwnership

            store = cluster.store
            assert store is not None  # (set by cluster.start)
            ownership = LeaseOwnership(config.node_name, lambda: store.state, store.apply, view.shovel_owner)
            await _start_shovels(nursery, view, config, ports[0], broker.config.link_login, ownership)
        from node.runtime.cluster.mirror_handover import hand_over_mirrors

        await hand_over_mirrors(cluster)  # ha-promote-on-shutdown: before the replication stops
        nursery.cancel_scope.cancel()


def _cluster_refusal(exc: BaseException) -> BaseException | None:
    """The metadata join error inside `exc` (possibly an exception group), if that is why the node stopped."""
    from cluster.metadata.store import ClusterSecretError, MetadataError

    if isinstance(exc, ClusterSecretError | MetadataError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _cluster_refusal(inner)
            if found is not None:
                return found
    return None


def main(argv: list[str]) -> int:
    try:
        config, namespace = load(argv)
        if config.ssl_port or config.ssl_proxy_protocol_port:  # the certificate files: a bad one is a configuration error, found before starting
            from node.runtime.tls import server_context

            server_context(config)
        if config.management_ssl_port or config.prometheus_ssl_port:
            from node.runtime.tls import management_context

            management_context(config)
    except ConfigError as exc:
        print(f"raftmq node: configuration error: {exc}", file=sys.stderr)
        return 2
    if namespace.print_config:
        print(describe(config))
        return 0
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    import trio

    try:
        trio.run(_serve_cluster if config.clustered else _serve, config)
    except OSError as exc:
        print(f"raftmq node: cannot start: {exc}", file=sys.stderr)
        return 1
    except BaseException as exc:
        refusal = _cluster_refusal(exc)
        if refusal is None:
            raise
        print(f"raftmq node: cannot join the cluster: {type(refusal).__name__}: {refusal}", file=sys.stderr)
        return 2
    log.info("node %s stopped", config.node_name)
    return 0
