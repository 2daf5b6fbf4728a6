"""`BrokerView`: the management API's view of what one node's `Broker` knows (single-node mode, and the base the
cluster mode extends).

How it works: reads walk the broker's own tables (vhosts, users, permissions, exchanges, bindings, queues with
their queue machines, connections, consumers) on the trio thread, so they see a consistent snapshot without locks,
and return RabbitMQ-shaped dicts. Changes (`add_vhost`, `add_user`, `set_permissions`; `delete_vhost`, `delete_user`,
`clear_permissions` through node/broker/admin_delete.py) call the broker's admin
methods, take the `Persist` effects those queue and hand them to `apply_effects`, the callback the runtime gives
(single node: `Node.dispatch`, which writes them to the store). The callback may be async; it is awaited, so a
runtime that waits for its storage or its metadata group makes the HTTP answer wait too. When effects held a
`Persist`, the answer also waits for `wait_durable()` (single node: `Store.wait_durable`, given by main.py): a change
answered 2xx survives a kill -9. Policies
(`set_policy`/`clear_policy`, node/broker/policies.py) are the broker's: validated (400 with the reason), applied to
the vhost's queues and exchanges at once, and stored with the definitions; queue rows show the `policy` that
applies and its `effective_policy_definition`. The cluster commands answer 501 "not in a cluster": cluster
membership and queue placement belong to the cluster runtime, which subclasses this view and overrides `nodes`,
`queues`, `policies` and `run_command`. Runtime parameters (`set_parameter`/`clear_parameter`, component "shovel"
only, validated by cluster/shovel/params.py) are stored with the definitions (`Broker.set_parameter`); the cluster
view keeps them in the metadata instead. `shovels` is the node's ShovelManager (docs/shovel.md), set by main.py.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cluster.federation import params as fed_params
from cluster.shovel.params import ShovelParamError, parse_definition
from node.amqp.errors import reply_text
from node.amqp.spec import ReplyCode
from node.broker import admin_delete, policy_apply, user_limits, vhost_limits
from node.broker import policies as pol
from node.broker.auth import User
from node.broker.backend_mirror import mirror_status
from node.broker.effects import CloseConnection, Persist
from node.broker.records import UserRecord
from node.runtime.management_api import CLUSTER_COMMANDS, NOT_IN_CLUSTER, CommandError
from node.runtime.management_http import properties_key

PRODUCT = "raftmq"
MANAGEMENT_VERSION = "3.12.0"  # the RabbitMQ management API generation whose paths and fields we follow
HASHING_ALGORITHM = "rabbit_password_hashing_sha256"


def _text(value: Any, default: str) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else default


class BrokerView:
    """The management view of one node's broker. `apply_effects(effects)` receives every effect an admin change
    produced (Persist records first of all); it may return an awaitable, which is awaited before answering."""

    def __init__(self, broker: Any, apply_effects: Callable[[list[Any]], Any], *, node_name: str,
                 amqp_port: int = 5672, management_port: int | None = None, cluster_name: str | None = None,
                 version: str = "0.1.0", wait_durable: Callable[[], Awaitable[None]] | None = None) -> None:
        self.broker = broker
        self.apply_effects = apply_effects
        self.wait_durable = wait_durable  # what makes a change durable before it is answered (None: apply_effects)
        self.node_name = node_name
        self.amqp_port = amqp_port
        self.management_port = management_port
        self.cluster_name = cluster_name or node_name
        self.version = version
        self.started_ms = int(time.time() * 1000)
        self.shovels: Any = None  # the node's ShovelManager (cluster/shovel/manager.py), set by main.py
        self.static_shovels: Any = None  # the ShovelManager of the config file's static shovels, if any
        self.federation: Any = None  # the node's FederationManager (cluster/federation/manager.py), set by main.py
        self.counters: Any = None  # the node (messages_received/_delivered) and its resource probe, set by main.py
        self.probe: Any = None
        # (protocol, port) of the node's other listeners, as RabbitMQ names them ("amqp/ssl", "https",
        # "http/prometheus", "https/prometheus"), appended by main.py as it binds them
        self.more_listeners: list[tuple[str, int]] = []

    # --- authentication -------------------------------------------------------------------------------------

    def authenticate(self, username: str, password: str, peer_is_loopback: bool) -> tuple[str, ...] | None:
        user = self.broker.users.authenticate_plain(username, password, peer_is_loopback)
        return None if user is None else tuple(user.tags)

    # --- reads ----------------------------------------------------------------------------------------------

    def overview(self) -> dict[str, Any]:
        queues = self.queues()
        listeners = [{"node": self.node_name, "protocol": "amqp", "port": self.amqp_port}]
        if self.management_port is not None:
            listeners.append({"node": self.node_name, "protocol": "http", "port": self.management_port})
        listeners.extend({"node": self.node_name, "protocol": protocol, "port": port}
                         for protocol, port in self.more_listeners)
        return {
            "management_version": MANAGEMENT_VERSION, "product_name": PRODUCT, "product_version": self.version,
            "rabbitmq_version": MANAGEMENT_VERSION, "cluster_name": self.cluster_name, "node": self.node_name,
            "object_totals": {
                "connections": len(self.broker.conns),
                "channels": sum(len(c.channels) for c in self.broker.conns.values()),
                "exchanges": len(self.exchanges()), "queues": len(queues), "consumers": len(self.broker.consumers),
            },
            "queue_totals": {
                "messages": sum(q["messages"] for q in queues),
                "messages_ready": sum(q["messages_ready"] for q in queues),
                "messages_unacknowledged": sum(q["messages_unacknowledged"] for q in queues),
            },
            "listeners": listeners, "contexts": self.contexts(),
            "message_stats": self.message_stats(),
        }

    def contexts(self) -> list[dict[str, Any]]:
        """The node's HTTP listeners as RabbitMQ's overview and /api/nodes `contexts` list them (port as a string;
        the HTTPS ones with "ssl": true)."""
        http = [("http", self.management_port)] if self.management_port is not None else []
        rows = []
        for protocol, port in [*http, *self.more_listeners]:
            if protocol.startswith("http"):
                rows.append({"node": self.node_name, "path": "/", "port": str(port),
                             "description": "RabbitMQ Prometheus" if "prometheus" in protocol else "RabbitMQ Management",
                             **({"ssl": True} if protocol.startswith("https") else {})})
        return rows

    def message_stats(self) -> dict[str, int]:
        """This node's monotonic message counts, with RabbitMQ's overview field names (the console's rates)."""
        counters, broker = self.counters, self.broker
        return {"publish": getattr(counters, "messages_received", 0),
                "deliver_get": getattr(counters, "messages_delivered", 0),
                "confirm": getattr(broker, "messages_confirmed", 0),
                "return_unroutable": getattr(broker, "messages_unroutable_returned", 0),
                "drop_unroutable": getattr(broker, "messages_unroutable_dropped", 0)}

    def nodes(self) -> list[dict[str, Any]]:
        return [{"name": self.node_name, "type": "disc", "running": True, "being_drained": False,
                 "uptime": int(time.time() * 1000) - self.started_ms, "partitions": [],
                 "mem_alarm": "memory" in self.broker.alarms, "disk_free_alarm": "disk" in self.broker.alarms,
                 "contexts": self.contexts(), **self._resources()}]

    def _resources(self) -> dict[str, int]:
        """Memory used and its limit, free disk and its limit (RabbitMQ's /api/nodes fields), from the probe."""
        probe = self.probe
        if probe is None:
            return {}
        from node.runtime.probes import disk_free_bytes, rss_bytes

        free = disk_free_bytes(probe.data_dir)
        return {"mem_used": rss_bytes(), "mem_limit": probe.memory_limit_bytes,
                "disk_free": free if free is not None else 0,
                "disk_free_limit": probe.config.disk_free_limit_bytes}

    def vhosts(self) -> list[dict[str, Any]]:
        totals: dict[str, list[int]] = {}
        for q in self.queues():
            t = totals.setdefault(q["vhost"], [0, 0])
            t[0] += q["messages_ready"]
            t[1] += q["messages_unacknowledged"]
        rows = []
        for name in sorted(self.broker.vhosts):
            ready, unacked = totals.get(name, [0, 0])
            rows.append({"name": name, "description": "", "tracing": name in self.broker.trace_vhosts, "messages": ready + unacked,
                         "messages_ready": ready, "messages_unacknowledged": unacked})
        return rows

    def users(self) -> list[dict[str, Any]]:
        return [{"name": u.name, "password_hash": u.password_hash, "hashing_algorithm": HASHING_ALGORITHM,
                 "tags": list(u.tags), "limits": dict(self.broker.users.limits.get(u.name, {}))}
                for u in sorted(self.broker.users.users.values(), key=lambda u: u.name)]

    def permissions(self) -> list[dict[str, Any]]:
        return [{"user": user, "vhost": vhost, "configure": p.configure, "write": p.write, "read": p.read}
                for (user, vhost), p in sorted(self.broker.users.permissions.items())]

    def queues(self) -> list[dict[str, Any]]:
        rows = []
        for vhost_name in sorted(self.broker.vhosts):
            vhost = self.broker.vhosts[vhost_name]
            for name in sorted(vhost.queues):
                rows.append(self.queue_row(vhost.queues[name]))
        return rows

    def queue_row(self, queue: Any) -> dict[str, Any]:
        """One queue, as RabbitMQ's /api/queues lists it; `leader` and `members` are this node here."""
        machine = queue.machine
        ready, unacked = machine.ready_count, machine.unacked_count
        vhost = self.broker.vhosts.get(queue.vhost)
        policy = policy_apply.queue_policy(vhost, queue) if vhost is not None else None
        return {
            "name": queue.name, "vhost": queue.vhost, "type": _text(queue.arguments.get("x-queue-type"), "classic"),
            "durable": queue.durable, "auto_delete": queue.auto_delete, "exclusive": queue.exclusive_owner is not None,
            "arguments": queue.arguments, "node": self.node_name, "leader": self.node_name,
            "members": [self.node_name], "state": "running", "messages": ready + unacked, "messages_ready": ready,
            "messages_unacknowledged": unacked, "message_bytes_ready": machine.ready_bytes,
            "consumers": machine.consumer_count, "policy": policy.name if policy is not None else None,
            "messages_dlx": machine.held_count, "message_bytes_dlx": machine.held_bytes,
            "effective_policy_definition": pol.applied_definition(policy, "queue", pol.queue_type_of(queue.arguments)),
            **_mirror_fields(mirror_status(self.broker, queue, self.node_name)),
        }

    def mirror_statuses(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(vhost, queue, mirror status) of each mirrored queue (Prometheus' per-object mirror gauges)."""
        rows = []
        for vhost_name, vhost in self.broker.vhosts.items():
            for name, queue in vhost.queues.items():
                status = mirror_status(self.broker, queue, self.node_name)
                if status is not None:
                    rows.append((vhost_name, name, status))
        return rows

    def exchanges(self) -> list[dict[str, Any]]:
        rows = []
        for vhost_name in sorted(self.broker.vhosts):
            rows.append({"name": "", "vhost": vhost_name, "type": "direct", "durable": True, "auto_delete": False,
                         "internal": False, "arguments": {}})
            vhost = self.broker.vhosts[vhost_name]
            for name in sorted(vhost.exchanges):
                ex = vhost.exchanges[name]
                policy = vhost.policy_for("exchange", name)
                rows.append({"name": ex.name, "vhost": vhost_name, "type": ex.type, "durable": ex.durable,
                             "auto_delete": ex.auto_delete, "internal": ex.internal, "arguments": ex.arguments,
                             "policy": policy.name if policy is not None else None,
                             "effective_policy_definition": pol.applied_definition(policy, "exchange")})
        return rows

    def bindings(self) -> list[dict[str, Any]]:
        """Every binding, the default exchange's implicit one per queue first (as RabbitMQ lists them)."""
        rows = []
        for vhost_name in sorted(self.broker.vhosts):
            vhost = self.broker.vhosts[vhost_name]
            for queue in sorted(vhost.queues):
                rows.append(_binding_row(vhost_name, "", "queue", queue, queue, {}))
            for ex_name in sorted(vhost.exchanges):
                for b in vhost.exchanges[ex_name].bindings.values():
                    rows.append(_binding_row(vhost_name, b.source, b.dest.kind, b.dest.name, b.routing_key,
                                             b.arguments))
        return rows

    def connections(self) -> list[dict[str, Any]]:
        return [{"name": self.connection_name(c), "conn_id": c.conn_id, "node": self.node_name, "vhost": c.vhost,
                 "user": c.username, "peer_host": c.peer_host, "channels": len(c.channels),
                 "state": self._connection_state(c), "protocol": "AMQP 0-9-1"}
                for c in sorted(self.broker.conns.values(), key=lambda c: c.conn_id)]

    def _connection_state(self, conn: Any) -> str:
        """As RabbitMQ: "blocked" (resource alarm), "flow" (credit flow holds its reads: cluster mode), "running"."""
        if conn.blocked:
            return "blocked"
        if conn.conn_id in getattr(self.broker, "flow_paused", ()):
            return "flow"
        return "running" if conn.opened else "starting"

    def channels(self) -> list[dict[str, Any]]:
        """This node's channels, as RabbitMQ's /api/channels lists them."""
        rows = []
        for conn in sorted(self.broker.conns.values(), key=lambda c: c.conn_id):
            conn_name = self.connection_name(conn)
            for number, ch in sorted(conn.channels.items()):
                rows.append({
                    "name": f"{conn_name} ({number})", "number": number, "node": self.node_name,
                    "vhost": conn.vhost, "user": conn.username, "state": "running",
                    "connection_details": {"name": conn_name, "peer_host": conn.peer_host},
                    "consumer_count": len(ch.consumers), "messages_unacknowledged": len(ch.unacked),
                    "messages_unconfirmed": len(ch.confirm_waiting), "messages_uncommitted": 0,
                    "acks_uncommitted": 0, "prefetch_count": ch.prefetch_consumer,
                    "global_prefetch_count": ch.prefetch_channel, "confirm": ch.confirm,
                    "transactional": ch.tx is not None})
        return rows

    def alarms(self) -> list[str]:
        """The resource alarms in effect on this node ("memory", "disk")."""
        return sorted(str(a) for a in self.broker.alarms)

    def raft_groups(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(vhost, queue, Raft status) of every queue group this node hosts: none on a single node."""
        return []

    def peers(self) -> list[tuple[str, int]]:
        """(host, management port) of every other cluster node: none on a single node."""
        return []

    def has(self, kind: str, vhost: str, name: str) -> bool:
        """Whether vhost / queue / exchange `name` exists (the default exchange "" always does)."""
        found = self.broker.vhosts.get(vhost)
        if found is None:
            return False
        if kind == "queue":
            return name in found.queues
        if kind == "exchange":
            return name == "" or name in found.exchanges
        return True

    def connection_name(self, conn: Any) -> str:
        return f"{conn.peer_host or '?'} -> {self.node_name} #{conn.conn_id}"

    def consumers(self) -> list[dict[str, Any]]:
        rows = []
        for consumer in sorted(self.broker.consumers.values(), key=lambda c: c.consumer_id):
            conn = self.broker.conns.get(consumer.conn_id)
            rows.append({
                "consumer_tag": consumer.tag,
                "queue": {"name": consumer.queue.name, "vhost": consumer.queue.vhost},
                "channel_details": {
                    "connection_name": self.connection_name(conn) if conn is not None else "",
                    "number": consumer.channel.number, "node": self.node_name,
                    "peer_host": conn.peer_host if conn is not None else "",
                    "user": conn.username if conn is not None else ""},
                "ack_required": not consumer.no_ack, "prefetch_count": consumer.prefetch,
                "exclusive": consumer.exclusive, "active": True, "activity_status": "up",
                "arguments": {"x-priority": consumer.priority} if consumer.priority else {},
            })
        return rows

    def policies(self) -> list[dict[str, Any]]:
        return [pol.policy_row(vhost.policies[name])
                for _, vhost in sorted(self.broker.vhosts.items()) for name in sorted(vhost.policies)]

    def parameters(self) -> list[dict[str, Any]]:
        return [{"vhost": vhost, "component": component, "name": name, "value": json.loads(value)}
                for (component, vhost, name), value in sorted(self.broker.parameters.items())]

    def stored_shovels(self) -> dict[tuple[str, str], str]:
        """(vhost, name) -> JSON of every shovel definition (what the ShovelManager runs)."""
        return {(vhost, name): value for (component, vhost, name), value in self.broker.parameters.items()
                if component == "shovel"}

    def shovel_status(self) -> list[dict[str, Any]]:
        static = self.static_shovels.status() if self.static_shovels is not None else []
        return (self.shovels.status() if self.shovels is not None else []) + static

    def federation_links(self) -> list[dict[str, Any]]:
        """The federation links (exchange and queue) this node runs (RabbitMQ's federation_status reports one node
        too)."""
        return self.federation.status() if self.federation is not None else []

    def queue_policies(self) -> list[tuple[str, str, str | None]]:
        """(vhost, queue, name of the policy that applies) of every queue: cheaper than `queues()` (no counts, no
        Raft status), for the federation manager's poll."""
        rows: list[tuple[str, str, str | None]] = []
        for vhost_name in sorted(self.broker.vhosts):
            vhost = self.broker.vhosts[vhost_name]
            for name in sorted(vhost.queues):
                policy = policy_apply.queue_policy(vhost, vhost.queues[name])
                rows.append((vhost_name, name, policy.name if policy is not None else None))
        return rows

    def queue_demand(self, vhost: str, name: str) -> tuple[int, int] | None:
        """(consumers, ready messages) of a queue as this node's replica knows them (cluster: every replica knows
        every node's consumers); None when the queue is not here. Queue federation links poll it."""
        host = self.broker.vhosts.get(vhost)
        queue = host.queues.get(name) if host is not None else None
        if queue is None:
            return None
        machine = queue.machine
        return int(machine.consumer_count), int(machine.ready_count)

    def vhost_limits(self) -> list[dict[str, Any]]:
        return [{"vhost": name, "value": dict(vhost.limits)}
                for name, vhost in sorted(self.broker.vhosts.items()) if vhost.limits]

    def user_limits(self) -> list[dict[str, Any]]:
        """Users with limits, as RabbitMQ's /api/user-limits: [{"user": name, "value": {limit: n}}]."""
        return [{"user": name, "value": dict(limits)} for name, limits in sorted(self.broker.users.limits.items())
                if limits]

    # --- changes --------------------------------------------------------------------------------------------

    def set_tracing(self, vhost: str, on: bool) -> None:
        """Firehose tracing of `vhost` on this node (node/broker/trace.py), as rabbit_trace:start/stop."""
        self.broker.set_tracing(vhost, on, self.node_name)

    async def close_connection(self, name: str, reason: str) -> bool:
        """Close this node's connection `name` with 320 CONNECTION_FORCED and `reason` (as RabbitMQ's DELETE
        /api/connections/{name}); False when no connection here has that name."""
        for conn in list(self.broker.conns.values()):
            if self.connection_name(conn) == name:
                text = reply_text(ReplyCode.CONNECTION_FORCED, reason)
                await self.emit([CloseConnection(conn.conn_id, int(ReplyCode.CONNECTION_FORCED), text)])
                return True
        return False

    async def read_barrier(self) -> bool:
        """A single node's definitions are its own: every change committed before a read is already here."""
        return True

    async def run_command(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        if name in ("set_parameter", "clear_parameter", "restart_shovel"):
            return await self._parameter_command(name, args)
        if name == "restart_federation_link":
            if self.federation is None or not self.federation.restart(args["vhost"], args["id"]):
                raise CommandError(404, f"no federation link {args['id']!r} in vhost {args['vhost']!r} runs on "
                                        "this node")
            return {}
        if name in ("sync_queue", "cancel_sync_queue"):  # one node: a mirrored queue is its own only replica
            return {}
        if name == "add_vhost":
            created = args["name"] not in self.broker.vhosts
            self.broker.add_vhost(args["name"])
        elif name == "add_user":
            created = args["name"] not in self.broker.users.users
            self.broker.add_user(args["name"], args["password"], tuple(args.get("tags", ())))
        elif name == "set_permissions":
            created = self._set_permissions(args)
        elif name in ("delete_user", "delete_vhost", "clear_permissions"):
            created = self._delete(name, args)
        elif name == "set_policy":
            created = self._set_policy(args)
        elif name == "clear_policy":
            if not self.broker.clear_policy(args["vhost"], args["name"]):
                raise CommandError(404, f"no policy {args['name']!r} in vhost {args['vhost']!r}")
            created = False
        elif name in ("set_vhost_limit", "clear_vhost_limit"):
            created = self._change_vhost_limit(name, args)
        elif name in ("set_user_limit", "clear_user_limit"):
            created = self._change_user_limit(name, args)
        elif name in CLUSTER_COMMANDS:
            raise CommandError(501, NOT_IN_CLUSTER)
        else:
            raise CommandError(404, f"unknown command {name!r}")
        await self.emit(self.broker.take_effects())
        return {"created": created}

    async def _parameter_command(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        key = (args.get("component", "shovel"), args["vhost"], args["name"])
        if name == "restart_shovel":
            if self.shovels is None or not self.shovels.restart(args["vhost"], args["name"]):
                raise CommandError(404, f"no shovel {args['name']!r} in vhost {args['vhost']!r} runs on this node")
            return {}
        if name == "clear_parameter":
            if not await self.clear_parameter(*key):
                raise CommandError(404, f"no parameter {key[0]}/{key[2]!r} in vhost {key[1]!r}")
            created = False
        else:
            created = await self.set_parameter(*key, validate_parameter(*key, args["value"]))
        if self.shovels is not None:
            self.shovels.poke()
        if self.federation is not None:
            self.federation.poke()
        return {"created": created}

    async def import_user(self, name: str, password_hash: str, tags: tuple[str, ...]) -> None:
        """A user with a password hash as a definitions file carries it (RabbitMQ's sha256 scheme, as ours): the
        smallest entry point the import needs that the broker lacks (Broker.add_user takes a password)."""
        self.broker.users.put_user(User(name, password_hash, tags))
        limits = dict(self.broker.users.limits.get(name, {}))  # (kept: the file's own are set after)
        self.broker.persist((UserRecord(name, password_hash, tags, limits=limits),))
        await self.emit(self.broker.take_effects())

    async def set_parameter(self, component: str, vhost: str, name: str, value_json: str) -> bool:
        try:
            created: bool = self.broker.set_parameter(component, vhost, name, value_json)
        except KeyError:
            raise CommandError(400, f"vhost_not_found: {vhost}") from None
        await self.emit(self.broker.take_effects())
        return created

    async def clear_parameter(self, component: str, vhost: str, name: str) -> bool:
        cleared: bool = self.broker.clear_parameter(component, vhost, name)
        await self.emit(self.broker.take_effects())
        return cleared

    def _set_policy(self, args: dict[str, Any]) -> bool:
        try:
            created: bool = self.broker.set_policy(args["vhost"], args["name"], args["pattern"],
                                                   args.get("apply_to"), args["definition"], args.get("priority"))
        except pol.PolicyError as exc:
            raise CommandError(400, str(exc)) from None
        except KeyError:
            raise CommandError(400, f"vhost_not_found: {args['vhost']}") from None
        return created

    def _change_vhost_limit(self, command: str, args: dict[str, Any]) -> bool:
        """Set or clear one of a vhost's limits (node/broker/vhost_limits.py); the others stay."""
        vhost = self.broker.vhosts.get(args["vhost"])
        if vhost is None:
            raise CommandError(400, f"vhost_not_found: {args['vhost']}")
        limits = dict(vhost.limits)
        created = args["name"] not in limits
        if command == "set_vhost_limit":
            limits[args["name"]] = args["value"]
        elif limits.pop(args["name"], None) is None:
            raise CommandError(404, f"no limit {args['name']!r} in vhost {args['vhost']!r}")
        try:
            self.broker.set_vhost_limits(args["vhost"], vhost_limits.validate(limits))
        except vhost_limits.VhostLimitError as exc:
            raise CommandError(400, str(exc)) from None
        return created

    def _change_user_limit(self, command: str, args: dict[str, Any]) -> bool:
        """Set or clear one of a user's limits (node/broker/user_limits.py); the others stay. 404 for no user."""
        if args["user"] not in self.broker.users.users:
            raise CommandError(404, f"user_not_found: {args['user']}", error="not_found")
        limits = dict(self.broker.users.limits.get(args["user"], {}))
        created = args["name"] not in limits
        if command == "set_user_limit":
            limits[args["name"]] = args["value"]
        else:
            limits.pop(args["name"], None)
        try:
            self.broker.set_user_limits(args["user"], user_limits.validate(limits))
        except user_limits.UserLimitError as exc:
            raise CommandError(400, str(exc)) from None
        return created

    def _delete(self, command: str, args: dict[str, Any]) -> bool:
        """DELETE of a user, a vhost or a user's permissions in a vhost (node/broker/admin_delete.py); 404 when
        there is no such thing, as RabbitMQ."""
        if command == "delete_user":
            found = admin_delete.delete_user(self.broker, args["name"])
        elif command == "delete_vhost":
            for component, vhost, name in [k for k in self.broker.parameters if k[1] == args["name"]]:
                self.broker.clear_parameter(component, vhost, name)
            found = admin_delete.delete_vhost(self.broker, args["name"])
        else:
            found = admin_delete.clear_permissions(self.broker, args["user"], args["vhost"])
        if not found:
            raise CommandError(404, "Not Found")
        if command == "delete_vhost":  # (its shovels and federation upstreams went with it)
            for manager in (self.shovels, self.federation):
                if manager is not None:
                    manager.poke()
        return False

    def _set_permissions(self, args: dict[str, Any]) -> bool:
        from node.broker.auth import Permission

        if args["vhost"] not in self.broker.vhosts:
            raise CommandError(400, f"vhost_not_found: {args['vhost']}")
        if args["user"] not in self.broker.users.users:
            raise CommandError(400, f"user_not_found: {args['user']}")
        created = (args["user"], args["vhost"]) not in self.broker.users.permissions
        self.broker.set_permissions(args["user"], args["vhost"],
                                    Permission(args["configure"], args["write"], args["read"]))
        return created

    async def emit(self, effects: list[Any]) -> None:
        """Hand effects to the runtime; await its answer when it returns an awaitable."""
        if not effects:
            return
        result = self.apply_effects(effects)
        if inspect.isawaitable(result):
            await result
        if self.wait_durable is not None and any(type(e) is Persist for e in effects):
            await self.wait_durable()


def validate_parameter(component: str, vhost: str, name: str, value: Any) -> str:
    """The parameter's value as JSON text once its component accepts it; CommandError 400 with the reason."""
    if component in fed_params.COMPONENTS:
        try:
            fed_params.parse(component, vhost, name, value)
        except fed_params.FederationParamError as exc:
            raise CommandError(400, f"Validation failed\n\n{exc}") from None
        return json.dumps(value, sort_keys=True)
    if component != "shovel":
        raise CommandError(400, f"component_not_found: {component} (shovel, federation-upstream and "
                                "federation-upstream-set parameters are built)")
    try:
        parse_definition(vhost, name, value)
    except ShovelParamError as exc:
        raise CommandError(400, f"Validation failed\n\n{exc}") from None
    return json.dumps(value, sort_keys=True)


def _binding_row(vhost: str, source: str, dest_kind: str, dest: str, key: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"source": source, "vhost": vhost, "destination": dest, "destination_type": dest_kind,
            "routing_key": key, "arguments": args, "properties_key": properties_key(key, args)}


def _mirror_fields(status: dict[str, Any] | None) -> dict[str, Any]:
    """A mirrored queue's extra columns: ours (`mirror`: leader, epoch, ISR, HW, each replica's LEO; `epoch`,
    `isr`, `hw` flat for `raftmq ctl list_queues`) and RabbitMQ's (`slave_nodes`, `synchronised_slave_nodes`)."""
    if status is None:
        return {}
    followers = [n for n in status["replicas"] if n != status["leader"]]
    return {"mirror": status, "leader": status["leader"], "members": status["replicas"], "epoch": status["epoch"],
            "isr": status["isr"], "hw": status["hw"], "slave_nodes": followers,
            "synchronised_slave_nodes": [n for n in followers if n in status["isr"]]}

