"""Definitions export and import (`GET/POST /api/definitions[/{vhost}]`) in RabbitMQ's file format.

How it works: export reads the view (users with their password hashes, vhosts, permissions, runtime parameters,
policies, and the non-exclusive queues, exchanges other than the default and amq.* ones, and bindings other than
the default exchange's) into RabbitMQ 3.10's JSON shape; a vhost's export leaves out users, vhosts and
permissions and drops the `vhost` fields, as RabbitMQ's does. Import takes the same sections in RabbitMQ's order
(users, vhosts, permissions, parameters, policies, queues, exchanges, bindings): users, vhosts, permissions,
parameters and policies go through the view's commands (as PUT /api/... would), users given with a password hash
through `BrokerView.import_user`, then their `limits` (user limits); queues, exchanges and bindings are declared
over AMQP as the importing user (management_amqp.py), so that user needs configure/write/read permissions in the vhosts the file fills (a file's
own permissions are set first). Sections raftmq does not have (topic permissions, global parameters other than
cluster_name, operator policies) are ignored. The first refused item stops the import with its error.
"""

from __future__ import annotations

from typing import Any

from node.runtime import management_amqp as amqp
from node.runtime.management_api import (
    Caller,
    CommandError,
    ManagementView,
    Reply,
    check_command_args,
    check_user_name,
    jsonable,
)
from node.runtime.management_http import RequestHead, parse_json_body

RABBIT_VERSION = "3.10.8"  # the definitions format we write (and read)


def _is_builtin_exchange(name: str) -> bool:
    return name == "" or name.startswith("amq.")


def export(view: ManagementView, vhost: str | None) -> dict[str, Any]:
    def in_scope(row: dict[str, Any]) -> bool:
        return vhost is None or row.get("vhost") == vhost

    queues = [{"name": q["name"], "vhost": q["vhost"], "durable": q["durable"], "auto_delete": q["auto_delete"],
               "arguments": q["arguments"]} for q in view.queues() if not q["exclusive"] and in_scope(q)]
    exchanges = [{"name": x["name"], "vhost": x["vhost"], "type": x["type"], "durable": x["durable"],
                  "auto_delete": x["auto_delete"], "internal": x["internal"], "arguments": x["arguments"]}
                 for x in view.exchanges() if not _is_builtin_exchange(x["name"]) and in_scope(x)]
    bindings = [{"source": b["source"], "vhost": b["vhost"], "destination": b["destination"],
                 "destination_type": b["destination_type"], "routing_key": b["routing_key"],
                 "arguments": b["arguments"]} for b in view.bindings() if b["source"] != "" and in_scope(b)]
    policies = [{"vhost": p["vhost"], "name": p["name"], "pattern": p["pattern"], "apply-to": p["apply-to"],
                 "definition": p["definition"], "priority": p["priority"]} for p in view.policies() if in_scope(p)]
    parameters = [{"value": p["value"], "vhost": p["vhost"], "component": p["component"], "name": p["name"]}
                  for p in view.parameters() if in_scope(p)]
    out: dict[str, Any] = {"rabbit_version": RABBIT_VERSION, "rabbitmq_version": RABBIT_VERSION,
                           "product_name": "raftmq", "product_version": RABBIT_VERSION}
    if vhost is None:
        out["users"] = [{"name": u["name"], "password_hash": u["password_hash"],
                         "hashing_algorithm": u["hashing_algorithm"], "tags": list(u["tags"]),
                         "limits": dict(u.get("limits") or {})}
                        for u in view.users()]
        out["vhosts"] = [{"name": v["name"]} for v in view.vhosts()]
        out["permissions"] = [{k: p[k] for k in ("user", "vhost", "configure", "write", "read")}
                              for p in view.permissions()]
        out["topic_permissions"] = []
    out.update({"parameters": parameters, "global_parameters": [], "policies": policies, "queues": queues,
                "exchanges": exchanges, "bindings": bindings})
    if vhost is not None:
        for section in ("parameters", "policies", "queues", "exchanges", "bindings"):
            for row in out[section]:
                row.pop("vhost", None)
    return jsonable(out)  # type: ignore[no-any-return]


def _section(body: dict[str, Any], name: str) -> list[dict[str, Any]]:
    rows = body.get(name) or []
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise CommandError(400, f"{name} must be a list of objects")
    return rows


def _tags(raw: Any) -> list[str]:
    if isinstance(raw, str):
        return [t.strip() for t in raw.split(",") if t.strip()]
    return [str(t) for t in raw] if isinstance(raw, list) else []


async def import_definitions(view: Any, body: dict[str, Any], caller: Caller, vhost: str | None) -> None:
    def where(row: dict[str, Any]) -> str:
        found = vhost if vhost is not None else row.get("vhost")
        if not isinstance(found, str):
            raise CommandError(400, f"no vhost in {row}")
        return found

    if vhost is None:
        for user in _section(body, "users"):  # a reserved name refuses the whole file before anything changed
            check_user_name(str(user.get("name")))
        for user in _section(body, "users"):
            if "password_hash" in user:
                await view.import_user(str(user["name"]), str(user["password_hash"]), tuple(_tags(user.get("tags"))))
            else:
                await view.run_command("add_user", check_command_args("add_user", {
                    "name": user.get("name"), "password": user.get("password"), "tags": _tags(user.get("tags"))}))
            limits = user.get("limits")
            for name, value in (limits.items() if isinstance(limits, dict) else ()):  # RabbitMQ 3.10's user limits
                await view.run_command("set_user_limit", check_command_args("set_user_limit", {
                    "user": user.get("name"), "name": name, "value": value}))
        for row in _section(body, "vhosts"):
            await view.run_command("add_vhost", check_command_args("add_vhost", {"name": row.get("name")}))
        for row in _section(body, "permissions"):
            await view.run_command("set_permissions", check_command_args("set_permissions", row))
    elif not view.has("vhost", vhost, ""):
        raise CommandError(404, "Not Found")
    for row in _section(body, "parameters"):
        await view.run_command("set_parameter", check_command_args("set_parameter", {**row, "vhost": where(row)}))
    for row in _section(body, "policies"):
        await view.run_command("set_policy", check_command_args("set_policy", {
            "vhost": where(row), "name": row.get("name"), "pattern": row.get("pattern"),
            "definition": row.get("definition"), "priority": row.get("priority"),
            "apply_to": row.get("apply-to", row.get("apply_to"))}))
    by_vhost: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for section in ("queues", "exchanges", "bindings"):
        for row in _section(body, section):
            by_vhost.setdefault(where(row), []).append((section, row))
    for name, rows in by_vhost.items():
        async with caller.amqp(name) as session:
            for section, row in rows:
                await _declare(session, section, row)


async def _declare(session: amqp.Session, section: str, row: dict[str, Any]) -> None:
    if section == "queues":
        await amqp.declare_queue(session, str(row.get("name", "")), row)
    elif section == "exchanges":
        if not _is_builtin_exchange(str(row.get("name", ""))):
            await amqp.declare_exchange(session, str(row.get("name", "")), row)
    else:
        kind = "q" if row.get("destination_type") == "queue" else "e"
        key = row.get("routing_key", "")
        await amqp.bind(session, str(row.get("source", "")), kind, str(row.get("destination", "")),
                        key if isinstance(key, str) else "", amqp.arguments_of(row))


async def handle_definitions_request(view: ManagementView, head: RequestHead, raw: bytes,
                                     caller: Caller) -> Reply | None:
    seg = head.segments
    if seg[:2] != ("api", "definitions") or len(seg) > 3:
        return None
    vhost = seg[2] if len(seg) == 3 else None
    if head.method in ("GET", "HEAD"):
        if vhost is not None and not view.has("vhost", vhost, ""):
            raise CommandError(404, "Not Found")
        return Reply(200, export(view, vhost), (("Content-Disposition", 'attachment; filename="definitions.json"'),))
    if head.method == "POST":
        body = parse_json_body(raw)
        if not isinstance(body, dict):
            raise CommandError(400, "the definitions must be a JSON object")
        await import_definitions(view, body, caller, vhost)
        return Reply(204)
    raise CommandError(405, f"{head.method} {head.target} is not supported", error="method_not_allowed")
