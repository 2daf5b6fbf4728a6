"""`raftmq ctl`: the command-line client of a node's management HTTP API (rabbitmqctl's commands, one binary).

How it works: every command is one or two HTTP requests to `--node host:port` (default $RAFTMQ_CTL_NODE or
127.0.0.1:15672, the management port of a node on AMQP port 5672) with basic auth (`--user/--password`, default
$RAFTMQ_CTL_USER/$RAFTMQ_CTL_PASSWORD or guest/guest). `list_*` commands print aligned tables (columns may be
named as extra arguments, as rabbitmqctl's info items; dotted names reach into nested fields: `queue.name`), or
the raw JSON with `--json`. Changes use the RabbitMQ paths (PUT /api/users/..., /api/permissions/...,
/api/policies/..., /api/parameters/..., /api/vhost-limits/...: `set_vhost_limits` replaces a vhost's limits as
rabbitmqctl does, one PUT per limit given and one DELETE per limit it drops); cluster and quorum-queue commands POST
to /api/raftmq/<command>. `shovel_status` lists /api/shovels (the node each shovel runs on, its state);
`federation_status` lists /api/federation-links (the links of the node asked, as in RabbitMQ);
`restart_shovel` is DELETE /api/shovels/vhost/<vhost>/<name>/restart; `restart_federation_link` is DELETE
/api/federation-links/vhost/<vhost>/<id>/<node>/restart (the node asked restarts it if it runs it).
`sync_queue`/`cancel_sync_queue [-p vhost] QUEUE` POST /api/queues/<vhost>/<name>/actions (mirrored queues,
ha-sync-mode manual; sync_queue answers `not_mirrored` for another queue, as rabbitmqctl).
`trace_on`/`trace_off [-p vhost]` switch Firehose tracing of the vhost on the node asked only (PUT /api/vhosts/<vhost>
{"tracing": ...}, as RabbitMQ's management API; rabbitmqctl's act on one node too): run them against every node
whose publishes and deliveries should be traced.

Exit codes (sysexits, as rabbitmqctl): 0 done; 64 bad usage; 65 the node refused the request (bad argument,
unknown object); 69 the node is unreachable, unavailable, or the command needs a cluster; 70 internal error on
the node; 77 authentication refused.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import quote

DEFAULT_NODE = "127.0.0.1:15672"
EXIT_OK, EXIT_USAGE, EXIT_DATAERR, EXIT_UNAVAILABLE, EXIT_SOFTWARE, EXIT_NOPERM = 0, 64, 65, 69, 70, 77
RESPONSE_BYTES_MAX = 64 * 1024 * 1024

LIST_COLUMNS: dict[str, tuple[str, tuple[str, ...]]] = {
    "list_vhosts": ("/api/vhosts", ("name", "messages")),
    "list_users": ("/api/users", ("name", "tags")),
    "list_permissions": ("/api/permissions", ("user", "vhost", "configure", "write", "read")),
    "list_queues": ("/api/queues", ("vhost", "name", "type", "messages_ready", "messages_unacknowledged",
                                    "consumers", "leader", "members")),
    "list_exchanges": ("/api/exchanges", ("vhost", "name", "type", "durable", "auto_delete")),
    "list_bindings": ("/api/bindings", ("vhost", "source", "destination", "destination_type", "routing_key",
                                        "arguments")),
    "list_connections": ("/api/connections", ("name", "node", "user", "vhost", "peer_host", "channels", "state")),
    "list_consumers": ("/api/consumers", ("queue.vhost", "queue.name", "consumer_tag", "ack_required",
                                          "prefetch_count", "exclusive", "channel_details.connection_name")),
    "list_policies": ("/api/policies", ("vhost", "name", "pattern", "apply-to", "definition", "priority")),
    "list_parameters": ("/api/parameters", ("component", "vhost", "name", "value")),
    "shovel_status": ("/api/shovels", ("name", "vhost", "type", "node", "state", "src_uri", "dest_uri",
                                       "termination_reason", "last_changed")),
    "list_vhost_limits": ("/api/vhost-limits", ("vhost", "value")),
    "federation_status": ("/api/federation-links", ("type", "vhost", "exchange", "upstream_exchange", "upstream",
                                                    "status", "error", "uri", "node", "timestamp")),
}
VHOST_SCOPED = frozenset({"list_permissions", "list_queues", "list_exchanges", "list_bindings", "list_consumers",
                          "list_policies", "shovel_status", "list_vhost_limits",
                          "federation_status"})


class CtlError(Exception):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


@dataclass(frozen=True, slots=True)
class Client:
    """A management API client: `call(method, path, body)` returns the decoded JSON (None for 204)."""

    node: str
    user: str
    password: str
    timeout_s: float = 30.0

    @property
    def base_url(self) -> str:
        return f"http://{self.node}"

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode("ascii")
        request.add_header("Authorization", f"Basic {token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read(RESPONSE_BYTES_MAX)
        except urllib.error.HTTPError as err:
            raise _http_error(err) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise CtlError(f"could not reach the management API at {self.base_url} ({reason}); is the node "
                           "running? (use --node host:port; the management port is the AMQP port + 10000)",
                           EXIT_UNAVAILABLE) from None
        return json.loads(raw) if raw else None


def _http_error(err: urllib.error.HTTPError) -> CtlError:
    try:
        body = json.loads(err.read(RESPONSE_BYTES_MAX) or b"{}")
        reason = body.get("reason") or body.get("error") or err.reason
    except ValueError:
        reason = err.reason
    status = err.code
    if status == 401:
        return CtlError(f"authentication refused: {reason}", EXIT_NOPERM)
    if status in (501, 503):
        return CtlError(f"the node cannot do this: {reason}", EXIT_UNAVAILABLE)
    if 400 <= status < 500:
        return CtlError(f"refused ({status}): {reason}", EXIT_DATAERR)
    return CtlError(f"the node failed ({status}): {reason}", EXIT_SOFTWARE)


def q(part: str) -> str:
    """One path segment, percent-encoded (the vhost "/" becomes %2F)."""
    return quote(part, safe="")


# --- output ---------------------------------------------------------------------------------------------------


def field_value(row: dict[str, Any], column: str) -> Any:
    value: Any = row
    for part in column.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(cell(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True) if value else ""
    return str(value)


def render_table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    table = [list(columns)] + [[cell(field_value(r, c)) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    return "\n".join("  ".join(text.ljust(w) for text, w in zip(line, widths, strict=True)).rstrip()
                     for line in table)


# --- commands -------------------------------------------------------------------------------------------------


def cmd_list(client: Client, args: argparse.Namespace) -> Any:
    path, default_columns = LIST_COLUMNS[args.command]
    if args.command in VHOST_SCOPED and args.vhost is not None:
        path += "/" + q(args.vhost)
    rows = client.call("GET", path)
    if args.json:
        return rows
    print(render_table(rows, tuple(args.columns) or default_columns))
    return None


def cmd_cluster_status(client: Client, args: argparse.Namespace) -> Any:
    overview = client.call("GET", "/api/overview")
    nodes = client.call("GET", "/api/nodes")
    report = {"cluster_name": overview.get("cluster_name"), "node": overview.get("node"), "nodes": nodes}
    if args.json:
        return report
    print(f"Cluster status of node {report['node']} (cluster {report['cluster_name']})")
    print(render_table(nodes, ("name", "running", "type", "uptime")))
    return None


def _done(args: argparse.Namespace, result: Any, message: str) -> Any:
    if args.json:
        return result if result is not None else {"ok": True}
    print(message)
    return None


def cmd_add_vhost(client: Client, args: argparse.Namespace) -> Any:
    client.call("PUT", f"/api/vhosts/{q(args.name)}", {})
    return _done(args, None, f"Added vhost {args.name!r}")


def cmd_add_user(client: Client, args: argparse.Namespace) -> Any:
    tags = [t for t in args.tags.split(",") if t] if args.tags else []
    client.call("PUT", f"/api/users/{q(args.name)}", {"password": args.password, "tags": tags})
    return _done(args, None, f"Added user {args.name!r}" + (f" with tags {','.join(tags)}" if tags else ""))


def cmd_set_permissions(client: Client, args: argparse.Namespace) -> Any:
    body = {"configure": args.configure, "write": args.write, "read": args.read}
    client.call("PUT", f"/api/permissions/{q(args.vhost or '/')}/{q(args.user)}", body)
    return _done(args, None, f"Set permissions for user {args.user!r} in vhost {args.vhost or '/'!r}")


def cmd_set_policy(client: Client, args: argparse.Namespace) -> Any:
    try:
        definition = json.loads(args.definition)
    except ValueError as exc:
        raise CtlError(f"the policy definition is not JSON: {exc}", EXIT_USAGE) from None
    body = {"pattern": args.pattern, "definition": definition, "priority": args.priority, "apply-to": args.apply_to}
    client.call("PUT", f"/api/policies/{q(args.vhost or '/')}/{q(args.name)}", body)
    return _done(args, None, f"Set policy {args.name!r} in vhost {args.vhost or '/'!r}")


def cmd_clear_policy(client: Client, args: argparse.Namespace) -> Any:
    client.call("DELETE", f"/api/policies/{q(args.vhost or '/')}/{q(args.name)}")
    return _done(args, None, f"Cleared policy {args.name!r} in vhost {args.vhost or '/'!r}")


def cmd_set_parameter(client: Client, args: argparse.Namespace) -> Any:
    try:
        value = json.loads(args.value)
    except ValueError as exc:
        raise CtlError(f"the parameter value is not JSON: {exc}", EXIT_USAGE) from None
    vhost = args.vhost or "/"
    client.call("PUT", f"/api/parameters/{q(args.component)}/{q(vhost)}/{q(args.name)}",
                {"component": args.component, "vhost": vhost, "name": args.name, "value": value})
    return _done(args, None, f"Set runtime parameter {args.name!r} for component {args.component!r} "
                             f"in vhost {vhost!r}")


def cmd_clear_parameter(client: Client, args: argparse.Namespace) -> Any:
    vhost = args.vhost or "/"
    client.call("DELETE", f"/api/parameters/{q(args.component)}/{q(vhost)}/{q(args.name)}")
    return _done(args, None, f"Cleared runtime parameter {args.name!r} for component {args.component!r} "
                             f"in vhost {vhost!r}")


def cmd_restart_federation_link(client: Client, args: argparse.Namespace) -> Any:
    vhost = args.vhost or "/"
    client.call("DELETE", f"/api/federation-links/vhost/{q(vhost)}/{q(args.id)}/-/restart")
    return _done(args, None, f"Restarted federation link {args.id!r} in vhost {vhost!r}")


def cmd_restart_shovel(client: Client, args: argparse.Namespace) -> Any:
    vhost = args.vhost or "/"
    client.call("DELETE", f"/api/shovels/vhost/{q(vhost)}/{q(args.name)}/restart")
    return _done(args, None, f"Restarted shovel {args.name!r} in vhost {vhost!r}")


def cmd_trace(client: Client, args: argparse.Namespace) -> Any:
    """trace_on / trace_off: Firehose tracing of one vhost on the node addressed (--node), as rabbitmqctl's."""
    vhost = args.vhost or "/"
    on = args.command == "trace_on"
    client.call("GET", f"/api/vhosts/{q(vhost)}")  # 404 (exit 65) for a vhost that does not exist
    client.call("PUT", f"/api/vhosts/{q(vhost)}", {"tracing": on})
    return _done(args, None, f"{'Started' if on else 'Stopped'} tracing for vhost {vhost!r} on node {client.node}")


def _current_limits(client: Client, vhost: str) -> dict[str, Any]:
    rows = client.call("GET", f"/api/vhost-limits/{q(vhost)}") or []
    return dict(rows[0]["value"]) if rows else {}


def cmd_set_vhost_limits(client: Client, args: argparse.Namespace) -> Any:
    try:
        limits = json.loads(args.definition)
    except ValueError as exc:
        raise CtlError(f"the limits are not JSON: {exc}", EXIT_USAGE) from None
    if not isinstance(limits, dict):
        raise CtlError("the limits must be a JSON object, e.g. '{\"max-connections\": 10}'", EXIT_USAGE)
    vhost = args.vhost or "/"
    for name, value in limits.items():
        client.call("PUT", f"/api/vhost-limits/{q(vhost)}/{q(name)}", {"value": value})
    for name in _current_limits(client, vhost):
        if name not in limits:
            client.call("DELETE", f"/api/vhost-limits/{q(vhost)}/{q(name)}")
    return _done(args, None, f"Set limits of vhost {vhost!r} to {json.dumps(limits)}")


def cmd_clear_vhost_limits(client: Client, args: argparse.Namespace) -> Any:
    vhost = args.vhost or "/"
    for name in _current_limits(client, vhost):
        client.call("DELETE", f"/api/vhost-limits/{q(vhost)}/{q(name)}")
    return _done(args, None, f"Cleared limits of vhost {vhost!r}")


SYNC_WAIT_S = 5.0  # sync_queue waits this long for the held-out mirrors to show in the ISR


def cmd_sync_queue(client: Client, args: argparse.Namespace) -> Any:
    """sync_queue / cancel_sync_queue (rabbitmqctl's): POST /api/queues/<vhost>/<name>/actions. A sync here only
    allows the held-out mirrors (ha-sync-mode manual) into the ISR, since every mirror holds the whole log already;
    sync_queue of a queue that is not mirrored is refused with RabbitMQ's `not_mirrored`. cancel_sync_queue has no
    sync to stop (RabbitMQ's `not_syncing`)."""
    vhost = args.vhost or "/"
    path = f"/api/queues/{q(vhost)}/{q(args.queue)}"
    syncing = args.command == "sync_queue"
    if not args.json:
        print(f"{'Synchronising' if syncing else 'Stopping synchronising'} queue {args.queue!r} in vhost {vhost!r} ...")
    row = client.call("GET", path)
    if syncing and not (isinstance(row, dict) and row.get("mirror")):
        raise CtlError("not_mirrored", EXIT_DATAERR)
    client.call("POST", path + "/actions", {"action": "sync" if syncing else "cancel_sync"})
    if not syncing:
        return _done(args, {"syncing": False}, "not_syncing (a sync here is immediate: nothing to cancel)")
    held = set((row.get("mirror") or {}).get("held_out") or {})
    deadline = time.monotonic() + SYNC_WAIT_S  # (a mirror whose node is down is not taken into the ISR meanwhile)
    while ((row.get("mirror") or {}).get("held_out") or not held <= set(row.get("synchronised_slave_nodes") or ())) \
            and time.monotonic() < deadline:
        time.sleep(0.1)
        row = client.call("GET", path)
    mirror = row.get("mirror") or {}
    result = {"synchronised_slave_nodes": row.get("synchronised_slave_nodes", []),
              "slave_nodes": row.get("slave_nodes", []), "held_out": sorted(mirror.get("held_out") or {})}
    waiting = "" if not result["held_out"] else f"; still held out: {', '.join(result['held_out'])}"
    return _done(args, result, f"synchronised mirrors: {', '.join(result['synchronised_slave_nodes']) or 'none'} "
                               f"(mirrors: {', '.join(result['slave_nodes']) or 'none'}{waiting})")


CLUSTER_ARGS: dict[str, tuple[str, ...]] = {
    "join_cluster": ("node",), "leave_cluster": (), "forget_cluster_node": ("node",),
    "add_member": ("vhost", "queue", "node"), "delete_member": ("vhost", "queue", "node"),
    "grow": ("node", "strategy", "vhost_pattern", "queue_pattern"), "shrink": ("node",),
    "rebalance": ("type", "vhost_pattern", "queue_pattern"),
}


MEMBERSHIP_TIMEOUT_S = 120.0  # join/leave/forget wait for queue moves and metadata group changes


def cmd_cluster(client: Client, args: argparse.Namespace) -> Any:
    body = {name: getattr(args, name) for name in CLUSTER_ARGS[args.command] if getattr(args, name, None) is not None}
    if args.command in ("join_cluster", "leave_cluster", "forget_cluster_node"):
        client = replace(client, timeout_s=max(client.timeout_s, MEMBERSHIP_TIMEOUT_S))
    if "vhost" in CLUSTER_ARGS[args.command]:
        body["vhost"] = args.vhost or "/"
    result = client.call("POST", f"/api/raftmq/{args.command}", body)
    if args.json:
        return result
    print(describe_result(args.command, result))
    return None


def describe_result(command: str, result: Any) -> str:
    """A command's answer for people: scalars as key=value, each list of objects as a table under its key."""
    if not isinstance(result, dict) or not result:
        return f"{command}: done"
    lines = [f"{command}: done"]
    for key, value in result.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            columns = tuple(dict.fromkeys(k for row in value for k in row))
            lines += [f"{key}:", render_table(value, columns)]
        elif isinstance(value, list) and not value:
            lines.append(f"{key}: none")
        else:
            lines.append(f"{key}: {cell(value)}")
    return "\n".join(lines)


# --- argument parsing -----------------------------------------------------------------------------------------


def _common(parser: argparse.ArgumentParser, suppress: bool) -> None:
    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    env = os.environ
    parser.add_argument("--node", "-n", dest="server", default=default(env.get("RAFTMQ_CTL_NODE", DEFAULT_NODE)),
                        help="management API host:port (default 127.0.0.1:15672)")
    parser.add_argument("--user", "-u", dest="ctl_user", default=default(env.get("RAFTMQ_CTL_USER", "guest")))
    parser.add_argument("--password", dest="ctl_password", default=default(env.get("RAFTMQ_CTL_PASSWORD", "guest")))
    parser.add_argument("--json", action="store_true", default=default(False), help="print JSON")
    parser.add_argument("--timeout", type=float, default=default(30.0), help="seconds per request")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raftmq ctl", description="manage a raftmq node or cluster")
    _common(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="<command>")
    handlers: dict[str, Callable[[Client, argparse.Namespace], Any]] = {}

    def add(name: str, handler: Callable[[Client, argparse.Namespace], Any], help_text: str,
            vhost: bool = False) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        _common(p, suppress=True)
        if vhost:
            p.add_argument("-p", "--vhost", default=None, help="virtual host (default: all, or / for changes)")
        handlers[name] = handler
        return p

    add("cluster_status", cmd_cluster_status, "nodes of the cluster and their state")
    for name in LIST_COLUMNS:
        p = add(name, cmd_list, f"{name.replace('_', ' ')}", vhost=name in VHOST_SCOPED)
        p.add_argument("columns", nargs="*", help="columns to show (default: a useful set)")
    add("add_vhost", cmd_add_vhost, "create a virtual host").add_argument("name")
    p = add("add_user", cmd_add_user, "create or update a user")
    p.add_argument("name")
    p.add_argument("password")
    p.add_argument("--tags", default="", help="comma-separated tags, e.g. administrator")
    p = add("set_permissions", cmd_set_permissions, "set a user's permissions in a vhost", vhost=True)
    for arg in ("user", "configure", "write", "read"):
        p.add_argument(arg)
    p = add("set_policy", cmd_set_policy, "set a policy", vhost=True)
    for arg in ("name", "pattern", "definition"):
        p.add_argument(arg)
    p.add_argument("--priority", type=int, default=0)
    p.add_argument("--apply-to", default="all", choices=("all", "queues", "exchanges"))  # RabbitMQ 3.10's values
    add("clear_policy", cmd_clear_policy, "remove a policy", vhost=True).add_argument("name")
    p = add("set_parameter", cmd_set_parameter,
            "set a runtime parameter (component shovel, federation-upstream or federation-upstream-set)", vhost=True)
    for arg in ("component", "name", "value"):
        p.add_argument(arg)
    p = add("clear_parameter", cmd_clear_parameter, "remove a runtime parameter", vhost=True)
    for arg in ("component", "name"):
        p.add_argument(arg)
    add("restart_shovel", cmd_restart_shovel, "restart a dynamic shovel (on the node that runs it)",
        vhost=True).add_argument("name")
    add("restart_federation_link", cmd_restart_federation_link,
        "restart a federation link by its id (federation_status; on the node that runs it)", vhost=True).add_argument("id")
    add("set_vhost_limits", cmd_set_vhost_limits, "replace a vhost's limits, e.g. '{\"max-connections\": 10, "
        "\"max-queues\": 100}' (negative: no limit)", vhost=True).add_argument("definition")
    add("clear_vhost_limits", cmd_clear_vhost_limits, "remove every limit of a vhost", vhost=True)
    add("trace_on", cmd_trace, "Firehose: copy every message published or delivered in the vhost to its "
        "amq.rabbitmq.trace exchange, on the node addressed by --node only", vhost=True)
    add("trace_off", cmd_trace, "Firehose: stop tracing the vhost on the node addressed by --node", vhost=True)
    add("sync_queue", cmd_sync_queue, "let a mirrored queue's unsynchronised mirrors (ha-sync-mode manual) into the "
        "in-sync set", vhost=True).add_argument("queue")
    add("cancel_sync_queue", cmd_sync_queue, "accepted as rabbitmqctl's; a sync here is immediate, so there is "
        "nothing to cancel", vhost=True).add_argument("queue")
    add("join_cluster", cmd_cluster, "make the node addressed by --node (fresh, alone) join the cluster of NODE "
        "(rabbit@host, host:amqp_port, or name=host:amqp[:raft[:metadata]])").add_argument("node")
    add("leave_cluster", cmd_cluster, "the node addressed by --node leaves its cluster (queue replicas moved away) "
        "and stops")
    add("forget_cluster_node", cmd_cluster, "remove a stopped node from the cluster (its queue replicas move)"
        ).add_argument("node")
    for name, what in (("add_member", "add a replica of a quorum queue on NODE"),
                       ("delete_member", "remove the replica of a quorum queue on NODE")):
        p = add(name, cmd_cluster, what, vhost=True)
        p.add_argument("queue")
        p.add_argument("node")
    p = add("grow", cmd_cluster, "add NODE as a member of quorum queues (strategy all or even)")
    p.add_argument("node")
    p.add_argument("strategy", choices=("all", "even"))
    p.add_argument("--vhost-pattern", dest="vhost_pattern", default=None)
    p.add_argument("--queue-pattern", dest="queue_pattern", default=None)
    add("shrink", cmd_cluster, "remove NODE from every quorum queue's members").add_argument("node")
    p = add("rebalance", cmd_cluster, "spread quorum queue leaders evenly over the nodes")
    p.add_argument("type", nargs="?", default=None, choices=("all", "quorum", "classic"))
    p.add_argument("--vhost-pattern", dest="vhost_pattern", default=None)
    p.add_argument("--queue-pattern", dest="queue_pattern", default=None)
    parser.set_defaults(handlers=handlers)
    return parser


def main(argv: list[str]) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return EXIT_OK if exc.code in (0, None) else EXIT_USAGE
    client = Client(args.server, args.ctl_user, args.ctl_password, args.timeout)
    try:
        result = args.handlers[args.command](client, args)
    except CtlError as err:
        print(f"Error: {err.message}", file=sys.stderr)
        return err.exit_code
    if result is not None:
        print(json.dumps(result, indent=2))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
