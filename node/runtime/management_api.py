"""The management API's routes: RabbitMQ-compatible paths mapped onto a `ManagementView` (no sockets, no trio).

How it works: `handle_request(view, head, body, peer_is_loopback)` checks basic auth against the view (an
administrator user, as RabbitMQ's management plugin requires for these endpoints; users in loopback_users only
from loopback), then dispatches on the method and the percent-decoded path segments. Reads call the view's sync
list methods and filter by vhost/name here; changes become `await view.run_command(name, args)` with arguments
checked here first (`COMMAND_ARGS`), so every view receives well-typed arguments. A view refuses a command by
raising `CommandError(status, reason)` (501 "not in a cluster" for cluster commands on a single node). The answer
is `Reply(status, payload, headers)`; errors carry RabbitMQ's `{"error": ..., "reason": ...}` shape. A request that
reads or changes definitions (`needs_read_barrier`), and a refused login, first awaits `view.read_barrier()` (cluster
mode: this node catches up with the metadata group, so it sees a change just made through another node; past its
bound the answer carries `X-Raftmq-Metadata: unconfirmed`; docs/management.md, "Reads see every committed change").

Paths: GET /api/overview, /api/whoami, /api/nodes[/name], /api/vhosts[/vhost], /api/users[/name],
/api/permissions[/vhost/user], /api/queues[/vhost[/name]], /api/exchanges[/vhost[/name]], /api/bindings[/vhost],
/api/connections, /api/consumers[/vhost], /api/policies[/vhost[/name]], /api/parameters[/component[/vhost[/name]]],
/api/shovels[/vhost], /api/shovels/vhost/{vhost}/{name}, /api/federation-links[/vhost], /api/vhost-limits[/vhost];
PUT /api/vhosts/{vhost} ({"tracing": true|false} also switches Firehose tracing of the vhost on this node only),
/api/users/{name}, /api/permissions/{vhost}/{user}, /api/policies/{vhost}/{name},
/api/parameters/{component}/{vhost}/{name} ({"value": {...}}), /api/vhost-limits/{vhost}/{limit} ({"value": N});
DELETE /api/vhosts/{vhost}, /api/users/{name}, /api/permissions/{vhost}/{user} (POST /api/users/bulk-delete
{"users": [...]}), /api/policies/{vhost}/{name}, /api/parameters/{component}/{vhost}/{name}, /api/vhost-limits/{vhost}/{limit},
/api/shovels/vhost/{vhost}/{name}/restart,
/api/federation-links/vhost/{vhost}/{id}/{node}/restart; POST /api/raftmq/{command} for the cluster commands (`CLUSTER_COMMANDS`).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import decimal
import logging
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from cluster.authlink.amqp_login import RESERVED_USER_PREFIX, is_reserved_user
from cluster.link.uri import local_uri_vhosts
from node.runtime.management_amqp import AmqpTarget, Session, amqp_session
from node.runtime.management_http import CommandError as CommandError
from node.runtime.management_http import HttpError, RequestHead, parse_json_body

log = logging.getLogger("raftmq.management")

REALM = 'Basic realm="RabbitMQ Management"'
ADMIN_TAG = "administrator"

# name -> ((arg, type, required), ...); `type` is what the JSON value must be.
COMMAND_ARGS: dict[str, tuple[tuple[str, Any, bool], ...]] = {
    "add_vhost": (("name", str, True),),
    "add_user": (("name", str, True), ("password", str, True), ("tags", list, False)),
    "set_permissions": (("vhost", str, True), ("user", str, True), ("configure", str, True),
                        ("write", str, True), ("read", str, True)),
    "delete_vhost": (("name", str, True),),
    "delete_user": (("name", str, True),),
    "clear_permissions": (("vhost", str, True), ("user", str, True)),
    "set_policy": (("vhost", str, True), ("name", str, True), ("pattern", str, True), ("definition", dict, True),
                   ("priority", int, False), ("apply_to", str, False)),
    "clear_policy": (("vhost", str, True), ("name", str, True)),
    "set_parameter": (("component", str, True), ("vhost", str, True), ("name", str, True),
                      ("value", (dict, list), True)),  # (a federation-upstream-set is a list)
    "clear_parameter": (("component", str, True), ("vhost", str, True), ("name", str, True)),
    "restart_shovel": (("vhost", str, True), ("name", str, True)),
    "restart_federation_link": (("vhost", str, True), ("id", str, True)),
    "set_vhost_limit": (("vhost", str, True), ("name", str, True), ("value", int, True)),
    "clear_vhost_limit": (("vhost", str, True), ("name", str, True)),
    "set_user_limit": (("user", str, True), ("name", str, True), ("value", int, True)),
    "clear_user_limit": (("user", str, True), ("name", str, True)),
    "join_cluster": (("node", str, True),),
    "leave_cluster": (),
    "forget_cluster_node": (("node", str, True),),
    "add_member": (("vhost", str, True), ("queue", str, True), ("node", str, True)),
    "delete_member": (("vhost", str, True), ("queue", str, True), ("node", str, True)),
    "grow": (("node", str, True), ("strategy", str, True), ("vhost_pattern", str, False),
             ("queue_pattern", str, False)),
    "shrink": (("node", str, True),),
    "rebalance": (("type", str, False), ("vhost_pattern", str, False), ("queue_pattern", str, False)),
}
CLUSTER_COMMANDS = frozenset({"join_cluster", "leave_cluster", "forget_cluster_node", "add_member", "delete_member",
                              "grow", "shrink", "rebalance"})
NOT_IN_CLUSTER = "not in a cluster"
JSON_TYPE_NAMES: dict[Any, str] = {str: "a string", int: "an integer", list: "an array", dict: "an object",
                                   (dict, list): "an object or an array"}


class ManagementView(Protocol):
    node_name: str
    amqp_port: int

    """What the management API reads and changes. Reads are sync snapshots (lists of JSON-able dicts with
    RabbitMQ's field names); changes go through `run_command`, which may wait (for storage or a Raft commit)."""

    def authenticate(self, username: str, password: str, peer_is_loopback: bool) -> tuple[str, ...] | None: ...
    def overview(self) -> dict[str, Any]: ...
    def nodes(self) -> list[dict[str, Any]]: ...
    def vhosts(self) -> list[dict[str, Any]]: ...
    def users(self) -> list[dict[str, Any]]: ...
    def permissions(self) -> list[dict[str, Any]]: ...
    def queues(self) -> list[dict[str, Any]]: ...
    def exchanges(self) -> list[dict[str, Any]]: ...
    def bindings(self) -> list[dict[str, Any]]: ...
    def connections(self) -> list[dict[str, Any]]: ...
    def consumers(self) -> list[dict[str, Any]]: ...
    def policies(self) -> list[dict[str, Any]]: ...
    def parameters(self) -> list[dict[str, Any]]: ...
    def shovel_status(self) -> list[dict[str, Any]]: ...
    def federation_links(self) -> list[dict[str, Any]]: ...
    def vhost_limits(self) -> list[dict[str, Any]]: ...
    def user_limits(self) -> list[dict[str, Any]]: ...
    def channels(self) -> list[dict[str, Any]]: ...
    def alarms(self) -> list[str]: ...
    def has(self, kind: str, vhost: str, name: str) -> bool: ...
    def peers(self) -> list[tuple[str, int]]: ...
    def set_tracing(self, vhost: str, on: bool) -> None: ...
    async def close_connection(self, name: str, reason: str) -> bool: ...
    async def run_command(self, name: str, args: dict[str, Any]) -> dict[str, Any]: ...
    async def read_barrier(self) -> bool:
        """Wait (bounded) until this node has every definition change committed before the call; False when it
        could not make sure in time (the request is then answered from what the node has). A single node: True."""
        ...


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    payload: Any = None
    headers: tuple[tuple[str, str], ...] = ()


def error_reply(status: int, error: str, reason: str, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(status, {"error": error, "reason": reason}, headers)


def jsonable(value: Any) -> Any:
    """Field-table values (bytes, Decimal, datetime, bytearray, tuples) as plain JSON values."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, bytearray):
        return bytes(value).hex()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    return str(value)


def parse_basic_auth(header: str) -> tuple[str, str] | None:
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


def check_command_args(name: str, args: Any) -> dict[str, Any]:
    """The arguments of command `name`, checked; CommandError 400 naming the first bad one."""
    spec = COMMAND_ARGS.get(name)
    if spec is None:
        raise CommandError(404, f"unknown command {name!r}")
    if not isinstance(args, dict):
        raise CommandError(400, "the body must be a JSON object")
    out: dict[str, Any] = {}
    for arg, kind, required in spec:
        if arg not in args or args[arg] is None:
            if required:
                raise CommandError(400, f"{name}: missing argument {arg!r}")
            continue
        value = args[arg]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise CommandError(400, f"{name}: argument {arg!r} must be {JSON_TYPE_NAMES[kind]}")
        out[arg] = value
    if "tags" in out and not all(isinstance(t, str) for t in out["tags"]):
        raise CommandError(400, f"{name}: tags must be strings")
    if name == "add_user":
        check_user_name(out["name"])
    return out


def check_user_name(name: str) -> None:
    """CommandError 400 for a name kept for the nodes' internal logins (cluster/authlink/amqp_login.py): such a
    user would never be asked for its password, so it is never created."""
    if is_reserved_user(name):
        raise CommandError(400, f"user name {name!r} is reserved: names starting with {RESERVED_USER_PREFIX!r} are "
                                "the nodes' internal logins")


Route = Callable[[ManagementView, RequestHead, bytes, "Caller"], Awaitable[Reply | None]]

# RabbitMQ's tags: administrator may do everything; monitoring and policymaker include management.
TAG_RANKS: dict[str, frozenset[str]] = {
    "management": frozenset({"management", "monitoring", "policymaker", ADMIN_TAG}),
    "monitoring": frozenset({"monitoring", ADMIN_TAG}),
    "policymaker": frozenset({"policymaker", ADMIN_TAG}),
    ADMIN_TAG: frozenset({ADMIN_TAG}),
}
TAG_REFUSALS = {"management": "Not management user", "monitoring": "Not monitor user",
                "policymaker": "User not authorised to access object", ADMIN_TAG: "Not administrator user"}
ADMIN_PATHS = frozenset({"users", "permissions", "definitions", "user-limits", "raftmq", "topic-permissions"})
MONITOR_PATHS = frozenset({"nodes", "federation-links", "shovels"})
POLICY_PATHS = frozenset({"policies", "parameters"})


def required_tag(method: str, segments: tuple[str, ...]) -> str:
    """The tag RabbitMQ's management plugin requires for a request (the paths it checks the same way)."""
    what = segments[1] if len(segments) > 1 else ""
    read = method in ("GET", "HEAD")
    if what in ADMIN_PATHS or (what == "vhosts" and not read and len(segments) == 3) or \
            (what == "vhost-limits" and not read) or (what == "queues" and segments[4:] == ("actions",)):
        return ADMIN_TAG
    if what in MONITOR_PATHS or what == "vhost-limits":
        return "monitoring"
    if what in POLICY_PATHS:
        return "policymaker"
    return "management"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking: their credentials (AMQP operations run as them), tags, and the vhosts they may see (None: all,
    for administrator and monitoring users, as in RabbitMQ)."""

    user: str
    password: str
    tags: tuple[str, ...]
    target: AmqpTarget
    vhosts: frozenset[str] | None = None

    @property
    def authorization(self) -> str:
        """The caller's credentials as a Basic Authorization header (to ask peers for their rows as them)."""
        return "Basic " + base64.b64encode(f"{self.user}:{self.password}".encode()).decode("ascii")

    @property
    def sees_everything(self) -> bool:
        return self.vhosts is None

    def amqp(self, vhost: str) -> AbstractAsyncContextManager[Session]:
        return amqp_session(self.target, self.user, self.password, vhost)

    def visible(self, rows: Iterable[dict[str, Any]], key: str = "vhost") -> list[dict[str, Any]]:
        vhosts = self.vhosts
        return list(rows) if vhosts is None else [r for r in rows if _row_vhost(r, key) in vhosts]

    def visible_connections(self, rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """Monitoring and administrator users see every connection and channel; others their own."""
        return list(rows) if self.vhosts is None else [r for r in rows if r.get("user") == self.user]


def _caller(view: ManagementView, user: str, password: str, tags: tuple[str, ...]) -> Caller:
    target = AmqpTarget(port=view.amqp_port)
    if ADMIN_TAG in tags or "monitoring" in tags:
        return Caller(user, password, tags, target)
    return Caller(user, password, tags, target, _permitted_vhosts(view, user))


def _permitted_vhosts(view: ManagementView, user: str) -> frozenset[str]:
    """The vhosts `user` has permissions in."""
    return frozenset(p["vhost"] for p in view.permissions() if p["user"] == user)


# The definitions (cluster mode: the metadata group's): a GET of these paths, and every change but a connection's
# close, first waits for the view's read barrier. The rest (overview, nodes, connections, channels, consumers,
# shovel and federation status, health checks) is this node's live state, or its peers', and never waits.
DEFINITION_PATHS = frozenset({"vhosts", "users", "permissions", "topic-permissions", "policies", "operator-policies",
                              "parameters", "global-parameters", "vhost-limits", "user-limits", "definitions",
                              "exchanges", "queues", "bindings"})
STALE_HEADER = ("X-Raftmq-Metadata", "unconfirmed")  # the read barrier timed out: answered from this node's copy


def needs_read_barrier(head: RequestHead) -> bool:
    """Whether the request reads or changes definitions (a peer's `raftmq_local` sub-request never waits: the node
    that asks it has passed its own barrier)."""
    segments = head.segments
    if len(segments) < 2 or segments[0] != "api" or head.query.get("raftmq_local"):
        return False
    if head.method in ("GET", "HEAD"):
        return segments[1] in DEFINITION_PATHS and segments[3:] != ("channels",)  # (/api/vhosts/{v}/channels)
    return segments[1] != "connections"


async def handle_request(view: ManagementView, head: RequestHead, body: bytes, peer_is_loopback: bool,
                         routes: tuple[Route, ...] = ()) -> Reply:
    """Authenticate, check the tag, route and run one request; never raises for a bad request. A login refused, or
    a request that reads or changes definitions, first waits for the view's read barrier (cluster mode: the user
    or its tags may have just been changed through another node; a read sees every change committed before it)."""
    reply, barrier_failed = await _handle(view, head, body, peer_is_loopback, routes)
    return Reply(reply.status, reply.payload, (*reply.headers, STALE_HEADER)) if barrier_failed else reply


async def _handle(view: ManagementView, head: RequestHead, body: bytes, peer_is_loopback: bool,
                  routes: tuple[Route, ...]) -> tuple[Reply, bool]:
    """The reply, and whether a read barrier was waited for and timed out."""
    credentials = parse_basic_auth(head.headers.get("authorization", ""))
    if credentials is None:
        return error_reply(401, "not_authorised", "Login failed", (("WWW-Authenticate", REALM),)), False
    needed = required_tag(head.method, head.segments)
    barrier = True
    tags = view.authenticate(credentials[0], credentials[1], peer_is_loopback)
    if tags is None or not TAG_RANKS[needed] & set(tags):
        barrier = await view.read_barrier()
        tags = view.authenticate(credentials[0], credentials[1], peer_is_loopback)
    elif needs_read_barrier(head):
        barrier = await view.read_barrier()
    if tags is None:
        return error_reply(401, "not_authorised", "Login failed", (("WWW-Authenticate", REALM),)), not barrier
    if not TAG_RANKS[needed] & set(tags):
        return error_reply(401, "not_authorised", TAG_REFUSALS[needed]), not barrier
    return await _authorised(view, head, body, credentials, tags, needed, routes), not barrier


async def _authorised(view: ManagementView, head: RequestHead, body: bytes, credentials: tuple[str, str],
                      tags: tuple[str, ...], needed: str, routes: tuple[Route, ...]) -> Reply:
    caller = _caller(view, credentials[0], credentials[1], tags)
    try:
        if needed == "policymaker" and head.method not in ("GET", "HEAD") and ADMIN_TAG not in tags:
            _check_policy_vhosts(view, head.segments, body, credentials[0])
        for route in routes:
            reply = await route(view, head, body, caller)
            if reply is not None:
                return _columns(reply, head)
        if head.method in ("GET", "HEAD"):
            return _columns(_visible(_get(view, head.segments, credentials[0], tags), head.segments, caller), head)
        return await _change(view, head, body)
    except CommandError as err:
        return error_reply(err.status, err.error or _error_name(err.status), err.reason)
    except HttpError as err:
        return error_reply(err.status, _error_name(err.status), err.reason)


def _check_policy_vhosts(view: ManagementView, segments: tuple[str, ...], raw_body: bytes, user: str) -> None:
    """A policymaker (not an administrator) changes policies and parameters only in vhosts it has permissions in,
    as in RabbitMQ; and a shovel or upstream URI naming the node itself (`amqp:///vhost`: links log in with their
    own identity, cluster/authlink) only in such a vhost too, as RabbitMQ's shovel validation checks the declaring
    user's access. (Administrators are not checked: RabbitMQ asks them for the vhost permission as well.)"""
    permitted = _permitted_vhosts(view, user)
    vhost_at = 3 if segments[1] == "parameters" else 2
    if len(segments) > vhost_at and segments[vhost_at] not in permitted:
        raise CommandError(401, "User not authorised to access virtual host", "not_authorised")
    if segments[1] != "parameters" or len(segments) != 5:
        return
    try:
        body = parse_json_body(raw_body)
    except HttpError:
        return  # (refused as a bad body later)
    value = body.get("value") if isinstance(body, dict) else None
    for vhost in local_uri_vhosts(segments[2], value):
        if vhost not in permitted:
            raise CommandError(400, f"Validation failed\n\nuser {user!r} may not access vhost {vhost!r} (named by "
                                    "a URI without a host: this node)")


def _columns(reply: Reply, head: RequestHead) -> Reply:
    """`?columns=name,consumers,message_stats.publish` (RabbitMQ's, which rabbitmqadmin's `list` sends): each row
    keeps only those fields (dotted: nested ones), leaving out the ones it lacks."""
    wanted = [c for value in head.query.get("columns", ()) for c in value.split(",") if c]
    if not wanted or reply.status != 200 or head.method not in ("GET", "HEAD"):
        return reply

    def pick(row: Any) -> Any:
        if not isinstance(row, dict):
            return row
        out: dict[str, Any] = {}
        for column in wanted:
            path = column.split(".")
            value: Any = row
            for key in path:
                value = value.get(key, _MISSING) if isinstance(value, dict) else _MISSING
            if value is _MISSING:
                continue
            node = out
            for key in path[:-1]:
                node = node.setdefault(key, {})
            node[path[-1]] = value
        return out

    payload = reply.payload
    return Reply(reply.status, [pick(r) for r in payload] if isinstance(payload, list) else pick(payload),
                 reply.headers)


_MISSING = object()


def _visible(reply: Reply, segments: tuple[str, ...], caller: Caller) -> Reply:
    """A listing as the caller may see it (users without monitoring see their vhosts' objects and their own
    connections only)."""
    if caller.sees_everything:
        return reply
    if isinstance(reply.payload, dict):
        vhost = reply.payload.get("name" if segments[1] == "vhosts" else "vhost")
        if isinstance(vhost, str) and caller.vhosts is not None and vhost not in caller.vhosts:
            raise CommandError(404, "Not Found")
        return reply
    if not isinstance(reply.payload, list):
        return reply
    what = segments[1]
    if what in ("connections", "channels"):
        return Reply(reply.status, caller.visible_connections(reply.payload), reply.headers)
    return Reply(reply.status, caller.visible(reply.payload, "name" if what == "vhosts" else "vhost"), reply.headers)


def _error_name(status: int) -> str:
    return {400: "bad_request", 404: "Object Not Found", 405: "method_not_allowed", 501: "not_implemented",
            503: "unavailable"}.get(status, "error")


def _filter(rows: list[dict[str, Any]], **wanted: str) -> list[dict[str, Any]]:
    return [r for r in rows if all(r.get(k) == v for k, v in wanted.items())]


def _one(rows: list[dict[str, Any]]) -> dict[str, Any]:
    if not rows:
        raise CommandError(404, "Not Found")
    return rows[0]


def _listing(fetch: Callable[[], list[dict[str, Any]]], rest: tuple[str, ...], key: str = "name") -> Any:
    """/api/<things>, /api/<things>/<vhost>, /api/<things>/<vhost>/<name>."""
    if len(rest) == 0:
        return fetch()
    if len(rest) == 1:
        return _filter(fetch(), vhost=rest[0])
    if len(rest) == 2:
        return _one(_filter(fetch(), vhost=rest[0], **{key: rest[1]}))
    raise CommandError(404, "Not Found")


def _get(view: ManagementView, segments: tuple[str, ...], user: str, tags: tuple[str, ...]) -> Reply:
    if len(segments) < 2 or segments[0] != "api":
        raise CommandError(404, "Not Found")
    what, rest = segments[1], segments[2:]
    if what == "overview" and not rest:
        return Reply(200, jsonable(view.overview()))
    if what == "whoami" and not rest:
        return Reply(200, {"name": user, "tags": list(tags)})
    if what in ("nodes", "vhosts", "users"):
        fetch = {"nodes": view.nodes, "vhosts": view.vhosts, "users": view.users}[what]
        if not rest:
            return Reply(200, jsonable(fetch()))
        if len(rest) == 1:
            return Reply(200, jsonable(_one(_filter(fetch(), name=rest[0]))))
    elif what == "permissions":
        if len(rest) <= 1:
            return Reply(200, jsonable(_filter(view.permissions(), **({"vhost": rest[0]} if rest else {}))))
        if len(rest) == 2:
            return Reply(200, jsonable(_one(_filter(view.permissions(), vhost=rest[0], user=rest[1]))))
    elif what in ("queues", "exchanges", "policies"):
        fetch = {"queues": view.queues, "exchanges": view.exchanges, "policies": view.policies}[what]
        return Reply(200, jsonable(_listing(fetch, rest)))
    elif what in ("bindings", "consumers") and len(rest) <= 1:
        fetch = view.bindings if what == "bindings" else view.consumers
        rows = fetch()
        if rest:
            rows = [r for r in rows if _row_vhost(r) == rest[0]]
        return Reply(200, jsonable(rows))
    elif what == "vhost-limits" and len(rest) <= 1:
        rows = view.vhost_limits()
        return Reply(200, jsonable([r for r in rows if r["vhost"] == rest[0]] if rest else rows))
    elif what == "connections" and not rest:
        return Reply(200, jsonable(view.connections()))
    elif what == "parameters" and len(rest) <= 3:
        rows = view.parameters()
        if rest:
            rows = _filter(rows, component=rest[0])
        return Reply(200, jsonable(_listing(lambda: rows, rest[1:])))
    elif what == "shovels":
        if rest[:1] == ("vhost",) and len(rest) == 3:  # /api/shovels/vhost/{vhost}/{name}
            return Reply(200, jsonable(_one(_filter(view.shovel_status(), vhost=rest[1], name=rest[2]))))
        if len(rest) <= 1:
            return Reply(200, jsonable(_listing(view.shovel_status, rest)))
    elif what == "federation-links" and len(rest) <= 1:  # this node's links, as in RabbitMQ
        return Reply(200, jsonable(_listing(view.federation_links, rest)))
    raise CommandError(404, "Not Found")


def _row_vhost(row: dict[str, Any], key: str = "vhost") -> Any:
    queue = row.get("queue")
    return row.get(key, queue.get("vhost") if isinstance(queue, dict) else None)


async def _bulk_delete_users(view: ManagementView, body: dict[str, Any]) -> None:
    """POST /api/users/bulk-delete {"users": [names]}, as RabbitMQ 3.10's: the users are deleted in order; the first
    that does not exist stops it with 400 ["no_such_user", name] (those before it stay deleted)."""
    users = body.get("users")
    if users is None:
        raise CommandError(400, "[{key_missing,users}]")
    if not isinstance(users, list) or not all(isinstance(u, str) for u in users):
        raise CommandError(400, "users must be a list of user names")
    for name in users:
        try:
            await view.run_command("delete_user", {"name": name})
        except CommandError as err:
            if err.status != 404:
                raise
            raise CommandError(400, ["no_such_user", name], error="bad_request") from None


def _put_command(segments: tuple[str, ...], body: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The command a PUT or DELETE path stands for, with its arguments (RabbitMQ's body field names)."""
    what, rest = segments[1], segments[2:]
    if what == "vhosts" and len(rest) == 1:
        return "add_vhost", {"name": rest[0]}
    if what == "users" and len(rest) == 1:
        tags = body.get("tags", [])
        if isinstance(tags, str):  # RabbitMQ accepts "a,b" as well as ["a", "b"]
            tags = [t.strip() for t in tags.split(",") if t.strip()]
        return "add_user", {"name": rest[0], "password": body.get("password"), "tags": tags}
    if what == "permissions" and len(rest) == 2:
        return "set_permissions", {"vhost": rest[0], "user": rest[1], "configure": body.get("configure"),
                                   "write": body.get("write"), "read": body.get("read")}
    if what == "parameters" and len(rest) == 3:
        return "set_parameter", {"component": rest[0], "vhost": rest[1], "name": rest[2], "value": body.get("value")}
    if what == "policies" and len(rest) == 2:
        return "set_policy", {"vhost": rest[0], "name": rest[1], "pattern": body.get("pattern"),
                              "definition": body.get("definition"), "priority": body.get("priority"),
                              "apply_to": body.get("apply-to", body.get("apply_to"))}
    if what == "vhost-limits" and len(rest) == 2:
        return "set_vhost_limit", {"vhost": rest[0], "name": rest[1], "value": body.get("value")}
    return None


async def _change(view: ManagementView, head: RequestHead, raw_body: bytes) -> Reply:
    segments = head.segments
    if len(segments) < 2 or segments[0] != "api":
        raise CommandError(404, "Not Found")
    body = parse_json_body(raw_body)
    if not isinstance(body, dict):
        raise CommandError(400, "the body must be a JSON object")
    if head.method == "POST" and segments[1] == "raftmq" and len(segments) == 3:
        name = segments[2]
        if name not in CLUSTER_COMMANDS:
            raise CommandError(404, f"unknown command {name!r}")
        result = await view.run_command(name, check_command_args(name, body))
        return Reply(200, jsonable(result))
    if head.method == "DELETE" and segments[1] == "parameters" and len(segments) == 5:
        await view.run_command("clear_parameter", {"component": segments[2], "vhost": segments[3],
                                                   "name": segments[4]})
        return Reply(204)
    if head.method == "DELETE" and segments[1:3] == ("shovels", "vhost") and len(segments) == 6 \
            and segments[5] == "restart":
        await view.run_command("restart_shovel", {"vhost": segments[3], "name": segments[4]})
        return Reply(204)
    if head.method == "DELETE" and segments[1:3] == ("federation-links", "vhost") and len(segments) == 7 \
            and segments[6] == "restart":  # /api/federation-links/vhost/{vhost}/{id}/{node}/restart
        await view.run_command("restart_federation_link", {"vhost": segments[3], "id": segments[4]})
        return Reply(204)
    if head.method == "DELETE" and segments[1] == "policies" and len(segments) == 4:
        await view.run_command("clear_policy", {"vhost": segments[2], "name": segments[3]})
        return Reply(204)
    if head.method == "DELETE" and segments[1] in ("vhosts", "users") and len(segments) == 3:
        await view.run_command(f"delete_{segments[1][:-1]}", {"name": segments[2]})
        return Reply(204)
    if head.method == "DELETE" and segments[1] == "permissions" and len(segments) == 4:
        await view.run_command("clear_permissions", {"vhost": segments[2], "user": segments[3]})
        return Reply(204)
    if head.method == "POST" and segments[1:] == ("users", "bulk-delete"):
        await _bulk_delete_users(view, body)
        return Reply(204)
    if head.method == "DELETE" and segments[1] == "vhost-limits" and len(segments) == 4:
        await view.run_command("clear_vhost_limit", {"vhost": segments[2], "name": segments[3]})
        return Reply(204)
    if head.method == "PUT":
        found = _put_command(segments, body)
        if found is not None:
            name, args = found
            result = await view.run_command(name, check_command_args(name, args))
            if name == "add_vhost" and "tracing" in body:  # Firehose on this node, as RabbitMQ's PUT
                view.set_tracing(args["name"], body["tracing"] is True)
            return Reply(201 if result.get("created") else 204)
    raise CommandError(405 if _put_command(segments, {}) is not None else 404,
                       f"{head.method} {head.target} is not supported")
