"""Management API routes for queues, exchanges, bindings, messages, channels, health checks and limits.

How it works: `handle_object_request(view, head, body, caller)` answers the paths below or returns None (the
caller then tries management_api's own routes). Changes to queues, exchanges and bindings, purge, publish, get
and the aliveness test run over AMQP as the caller (management_amqp.py), so the broker's own entry points and the
caller's permissions decide, as for any client. Reads come from the view. Paths (RabbitMQ's):
PUT/DELETE /api/queues/{vhost}/{name} (?if-empty, ?if-unused), DELETE /api/queues/{vhost}/{name}/contents,
POST /api/queues/{vhost}/{name}/get, POST /api/queues/{vhost}/{name}/actions (sync, cancel_sync),
GET /api/queues/{vhost}/{name}/bindings,
PUT/DELETE /api/exchanges/{vhost}/{name} (?if-unused), POST /api/exchanges/{vhost}/{name}/publish,
GET /api/exchanges/{vhost}/{name}/bindings/source|destination,
GET/POST /api/bindings/{vhost}/e/{source}/q|e/{destination}, GET/DELETE .../{properties_key},
GET /api/channels, /api/channels/{name}, /api/vhosts/{vhost}/channels, /api/connections/{name}/channels,
DELETE /api/connections/{name} (X-Reason: the close reason; cluster: the node holding it closes it),
GET /api/aliveness-test/{vhost}, /api/healthchecks/node, /api/health/checks/alarms|local-alarms,
GET /api/user-limits[/{user}], PUT/DELETE /api/user-limits/{user}/{max-connections|max-channels} (enforced by
the broker: node/broker/user_limits.py). In cluster mode GET /api/connections,
/api/channels and /api/consumers[/{vhost}] add every peer's rows (management_peers.py); /api/nodes adds each
peer's memory and disk figures and /api/overview adds up every node's message counts.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote_plus

from node.amqp import methods as m
from node.runtime import management_amqp as amqp
from node.runtime.management_api import (
    Caller,
    CommandError,
    ManagementView,
    Reply,
    check_command_args,
    jsonable,
)
from node.runtime.management_http import RequestHead, parse_json_body, properties_key
from node.runtime.management_peers import LOCAL_QUERY, peer_answers, peer_delete, peer_rows

DEFAULT_EXCHANGE = "amq.default"
CLUSTER_WIDE = frozenset({"connections", "channels", "consumers"})
ALIVENESS_QUEUE = "aliveness-test"


def _exchange_name(name: str) -> str:
    return "" if name == DEFAULT_EXCHANGE else name


def _body(raw: bytes) -> dict[str, Any]:
    body = parse_json_body(raw)
    if not isinstance(body, dict):
        raise CommandError(400, "the body must be a JSON object")
    return body


def _query_flag(head: RequestHead, name: str) -> bool:
    return head.query.get(name, ["false"])[-1].lower() == "true"


async def handle_object_request(view: ManagementView, head: RequestHead, raw: bytes, caller: Caller) -> Reply | None:
    seg = head.segments
    if len(seg) < 2 or seg[0] != "api":
        return None
    what, rest, method = seg[1], seg[2:], head.method
    if method == "HEAD":
        method = "GET"
    if what == "queues" and len(rest) >= 2:
        return await _queue(view, method, head, rest, raw, caller)
    if what == "exchanges" and len(rest) >= 2:
        return await _exchange(view, method, head, rest, raw, caller)
    if what == "bindings" and len(rest) >= 5 and rest[1] == "e" and rest[3] in ("q", "e"):
        return await _binding(view, method, rest, raw, caller)
    if method == "GET" and what in CLUSTER_WIDE and (len(rest) == 0 or (what == "consumers" and len(rest) == 1)):
        return await _cluster_wide(view, head, caller)
    if method == "GET" and what in ("nodes", "overview") and not rest and view.peers() and \
            LOCAL_QUERY not in head.query:
        return await _cluster_node_stats(view, what, caller)
    if method == "DELETE" and what == "connections" and len(rest) == 1:
        return await _close_connection(view, head, rest[0], caller)
    if method != "GET":
        if what == "user-limits" and len(rest) == 2 and method in ("PUT", "DELETE"):
            return await _user_limit(view, method, rest, raw)
        return None
    if what == "channels" and len(rest) <= 1:
        rows = caller.visible_connections(view.channels())
        return Reply(200, jsonable(rows if not rest else _one([r for r in rows if r["name"] == rest[0]])))
    if what == "vhosts" and len(rest) == 2 and rest[1] == "channels":
        return Reply(200, jsonable([r for r in caller.visible_connections(view.channels()) if r["vhost"] == rest[0]]))
    if what == "connections" and len(rest) == 2 and rest[1] == "channels":
        rows = caller.visible_connections(view.channels())
        return Reply(200, jsonable([r for r in rows if r["connection_details"]["name"] == rest[0]]))
    if what == "aliveness-test" and len(rest) == 1:
        return await _aliveness(view, rest[0], caller)
    if what == "healthchecks" and rest == ("node",):
        alarms = view.alarms()
        if alarms:
            return Reply(200, {"status": "failed", "reason": f"resource alarm(s) in effect: {', '.join(alarms)}"})
        return Reply(200, {"status": "ok"})
    if what == "health" and rest in (("checks", "alarms"), ("checks", "local-alarms")):
        alarms = view.alarms()
        if alarms:
            return Reply(503, {"status": "failed", "reason": "resource alarm(s) in effect",
                               "alarms": [{"node": view.node_name, "resource": a} for a in alarms]})
        return Reply(200, {"status": "ok"})
    if what == "user-limits" and len(rest) <= 1:
        rows = view.user_limits()
        return Reply(200, jsonable([r for r in rows if r["user"] == rest[0]] if rest else rows))
    return None


async def _cluster_wide(view: ManagementView, head: RequestHead, caller: Caller) -> Reply:
    """Connections, channels or consumers of every node: this node's, and (unless asked for its own only, as
    peers ask) each peer's over its management API (management_peers.py)."""
    what, rest = head.segments[1], head.segments[2:]
    rows = {"connections": view.connections, "channels": view.channels, "consumers": view.consumers}[what]()
    peers = view.peers()
    if peers and LOCAL_QUERY not in head.query:
        rows = rows + await peer_rows(peers, head.path, caller.authorization)
    if rest:
        rows = [r for r in rows if isinstance(r.get("queue"), dict) and r["queue"].get("vhost") == rest[0]]
    if what == "consumers":
        return Reply(200, jsonable(caller.visible(rows)))
    return Reply(200, jsonable(caller.visible_connections(rows)))


async def _user_limit(view: ManagementView, method: str, rest: tuple[str, ...], raw: bytes) -> Reply:
    """PUT /api/user-limits/{user}/{name} {"value": N} and DELETE of one limit (RabbitMQ 3.10's paths)."""
    user, name = rest
    if method == "PUT":
        value = _body(raw).get("value")
        args = check_command_args("set_user_limit", {"user": user, "name": name, "value": value})
        await view.run_command("set_user_limit", args)
    else:
        await view.run_command("clear_user_limit", {"user": user, "name": name})
    return Reply(204)


async def _close_connection(view: ManagementView, head: RequestHead, name: str, caller: Caller) -> Reply:
    """RabbitMQ's DELETE /api/connections/{name}: the node holding the connection closes it with 320
    CONNECTION_FORCED and the X-Reason header as its reason. A user who is neither administrator nor monitoring may
    close only their own connections (as RabbitMQ); others' are 404 to them, as they do not see them."""
    reason = head.headers.get("x-reason") or "Closed via management plugin"
    local = [r for r in view.connections() if r["name"] == name]
    if local:
        if not caller.visible_connections(local) or not await view.close_connection(name, reason):
            raise CommandError(404, "Not Found")
        return Reply(204)
    peers = view.peers()
    if peers and LOCAL_QUERY not in head.query:
        extra = (("X-Reason", reason),) if "x-reason" in head.headers else ()
        if await peer_delete(peers, head.path, caller.authorization, extra):
            return Reply(204)
    raise CommandError(404, "Not Found")


async def _cluster_node_stats(view: ManagementView, what: str, caller: Caller) -> Reply:
    """Cluster mode: /api/nodes with each running peer's own memory and disk figures, /api/overview with the
    message counts and the connection, channel and consumer totals of every node added up (each node counts its
    own clients)."""
    answers = await peer_answers(view.peers(), f"/api/{what}", caller.authorization)
    if what == "overview":  # (queues and exchanges are every broker's; connections, channels, consumers each node's)
        overview = view.overview()
        stats, totals = overview["message_stats"], overview["object_totals"]
        for answer in answers:
            if not isinstance(answer, dict):
                continue
            for key, value in (answer.get("message_stats") or {}).items():
                if isinstance(value, int) and key in stats:
                    stats[key] += value
            for key in ("connections", "channels", "consumers"):
                value = (answer.get("object_totals") or {}).get(key)
                if isinstance(value, int):
                    totals[key] += value
        return Reply(200, jsonable(overview))
    own = {row["name"]: row for rows in answers if isinstance(rows, list) for row in rows
           if isinstance(row, dict) and "mem_used" in row and isinstance(row.get("name"), str)}
    rows = [{**row, **own[row["name"]], "running": row["running"]} if row["name"] in own else row
            for row in view.nodes()]
    return Reply(200, jsonable(rows))


def _one(rows: list[dict[str, Any]]) -> dict[str, Any]:
    if not rows:
        raise CommandError(404, "Not Found")
    return rows[0]


def _need_vhost(view: ManagementView, vhost: str, creating: bool = False) -> None:
    if not view.has("vhost", vhost, ""):
        if creating:  # RabbitMQ's answer to a PUT into a missing vhost
            raise CommandError(404, "vhost_not_found", error="not_found")
        raise CommandError(404, "Not Found")


async def _queue(view: ManagementView, method: str, head: RequestHead, rest: tuple[str, ...], raw: bytes,
                 caller: Caller) -> Reply | None:
    vhost, name, tail = rest[0], rest[1], rest[2:]
    if method == "GET" and tail == ("bindings",):
        _need_vhost(view, vhost)
        if not view.has("queue", vhost, name):
            raise CommandError(404, "Not Found")
        return Reply(200, jsonable([b for b in view.bindings() if b["vhost"] == vhost
                                    and b["destination_type"] == "queue" and b["destination"] == name]))
    if method == "PUT" and not tail:
        _need_vhost(view, vhost, creating=True)
        body = _body(raw)
        existed = view.has("queue", vhost, name)
        async with caller.amqp(vhost) as session:
            await amqp.declare_queue(session, name, body)
        return Reply(204 if existed else 201)
    if method == "DELETE" and tail in ((), ("contents",)):
        _need_vhost(view, vhost)
        if not view.has("queue", vhost, name):
            raise CommandError(404, "Not Found")
        async with caller.amqp(vhost) as session:
            if tail:
                await amqp.call(session, m.QueuePurge(queue=name), m.QueuePurgeOk)
            else:
                await amqp.call(session, m.QueueDelete(queue=name, if_empty=_query_flag(head, "if-empty"),
                                                            if_unused=_query_flag(head, "if-unused")),
                                m.QueueDeleteOk)
        return Reply(204)
    if method == "POST" and tail == ("actions",):
        return await _queue_action(view, vhost, name, _body(raw))
    if method == "POST" and tail == ("get",):
        _need_vhost(view, vhost)
        body = _body(raw)
        async with caller.amqp(vhost) as session:
            return Reply(200, jsonable(await amqp.get(session, name, body)))
    if len(rest) == 2 and method in ("POST", "OPTIONS"):
        raise CommandError(405, f"{method} {head.target} is not supported", error="method_not_allowed")
    return None


async def _queue_action(view: ManagementView, vhost: str, name: str, body: dict[str, Any]) -> Reply:
    """POST /api/queues/{vhost}/{name}/actions {"action": "sync"|"cancel_sync"} (administrator), as RabbitMQ 3.10's:
    204 once asked, for a queue not mirrored too (RabbitMQ's management plugin does not wait for the answer);
    `raftmq ctl sync_queue` says `not_mirrored` itself. Mirrored queues: docs/mirrored_queues.md."""
    _need_vhost(view, vhost)
    if not view.has("queue", vhost, name):
        raise CommandError(404, "Not Found")
    if "action" not in body:
        raise CommandError(400, "[{key_missing,action}]", error="bad_request")
    action = body["action"]
    if action not in ("sync", "cancel_sync"):
        shown = f'<<"{action}">>' if isinstance(action, str) else json.dumps(action)
        raise CommandError(400, f"{{unknown,{shown}}}", error="bad_request")
    await view.run_command(f"{action}_queue", {"vhost": vhost, "queue": name})
    return Reply(204)


async def _exchange(view: ManagementView, method: str, head: RequestHead, rest: tuple[str, ...], raw: bytes,
                    caller: Caller) -> Reply | None:
    vhost, name, tail = rest[0], rest[1], rest[2:]
    if method == "GET" and len(tail) == 2 and tail[0] == "bindings" and tail[1] in ("source", "destination"):
        _need_vhost(view, vhost)
        if not view.has("exchange", vhost, _exchange_name(name)):
            raise CommandError(404, "Not Found")
        field = tail[1]
        return Reply(200, jsonable([b for b in view.bindings() if b["vhost"] == vhost and b[field] == name and
                                    (field == "source" or b["destination_type"] == "exchange")]))
    if method == "PUT" and not tail:
        _need_vhost(view, vhost, creating=True)
        body = _body(raw)
        existed = view.has("exchange", vhost, name)
        async with caller.amqp(vhost) as session:
            await amqp.declare_exchange(session, name, body)
        return Reply(204 if existed else 201)
    if method == "DELETE" and not tail:
        _need_vhost(view, vhost)
        if not view.has("exchange", vhost, name):
            raise CommandError(404, "Not Found")
        async with caller.amqp(vhost) as session:
            await amqp.call(session, m.ExchangeDelete(exchange=name, if_unused=_query_flag(head, "if-unused")),
                            m.ExchangeDeleteOk)
        return Reply(204)
    if method == "POST" and tail == ("publish",):
        _need_vhost(view, vhost)
        body = _body(raw)
        async with caller.amqp(vhost) as session:
            routed = await amqp.publish(session, _exchange_name(name), body)
        return Reply(200, {"routed": routed})
    return None


async def _binding(view: ManagementView, method: str, rest: tuple[str, ...], raw: bytes,
                   caller: Caller) -> Reply | None:
    vhost, source, kind, dest, tail = rest[0], rest[2], rest[3], rest[4], rest[5:]
    _need_vhost(view, vhost)
    dest_type = "queue" if kind == "q" else "exchange"
    rows = [b for b in view.bindings() if b["vhost"] == vhost and b["source"] == _exchange_name(source)
            and b["destination"] == dest and b["destination_type"] == dest_type]
    if method == "GET" and len(tail) <= 1:
        if not tail:
            return Reply(200, jsonable(rows))
        return Reply(200, jsonable(_one([b for b in rows if b["properties_key"] == tail[0]])))
    if method == "POST" and not tail:
        body = _body(raw)
        key = body.get("routing_key", "")
        if not isinstance(key, str):
            raise CommandError(400, "routing_key must be a string")
        args = amqp.arguments_of(body)
        if not view.has("exchange", vhost, _exchange_name(source)) or not view.has(dest_type, vhost, dest):
            raise CommandError(404, "Not Found")
        async with caller.amqp(vhost) as session:
            await amqp.bind(session, _exchange_name(source), kind, dest, key, args)
        location = f"{quote_plus(dest, safe='')}/{properties_key(key, args)}"  # relative, as RabbitMQ's
        return Reply(201, None, (("Location", location),))
    if method == "DELETE" and len(tail) == 1:
        found = _one([b for b in rows if b["properties_key"] == tail[0]])
        async with caller.amqp(vhost) as session:
            await amqp.bind(session, _exchange_name(source), kind, dest, found["routing_key"], found["arguments"],
                            unbind=True)
        return Reply(204)
    return None


async def _aliveness(view: ManagementView, vhost: str, caller: Caller) -> Reply:
    """RabbitMQ's aliveness test: declare the `aliveness-test` queue, publish to it, get the message back."""
    _need_vhost(view, vhost)
    async with caller.amqp(vhost) as session:
        await amqp.declare_queue(session, ALIVENESS_QUEUE, {"durable": False})
        await amqp.publish(session, "", {"routing_key": ALIVENESS_QUEUE, "properties": {},
                                         "payload": "test_message", "payload_encoding": "string"})
        got = await amqp.get(session, ALIVENESS_QUEUE, {"count": 1, "ackmode": "ack_requeue_false",
                                                          "encoding": "auto"})
    if not got or got[0]["payload"] != "test_message":
        return Reply(503, {"status": "failed", "reason": "the test message did not come back"})
    return Reply(200, {"status": "ok"})
