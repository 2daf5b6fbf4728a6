"""The real `rabbitmqadmin` (Debian's rabbitmq-server package, 3.10) against raftmq's management API, in both
modes: declare/delete of queues, exchanges and bindings, publish, get, purge, list channels and consumers,
export/import of definitions, and the health endpoints. In cluster mode the commands go to one node and the
answers are read from another (every node answers for the whole cluster). Answers RabbitMQ 3.10 gives the same
commands were checked by hand and by tests/management/test_rabbitmq_compare.py; this file checks raftmq alone.
Skipped when rabbitmqadmin is not installed."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.integration.conftest import Target
from tests.integration.test_vhost_limits import api, management_ports, quote

RABBITMQADMIN = shutil.which("rabbitmqadmin")
WAIT_S = 30.0
pytestmark = pytest.mark.skipif(RABBITMQADMIN is None, reason="rabbitmqadmin is not installed")


def admin(port: int, *args: str, user: str = "guest", password: str = "guest",
          fmt: str = "raw_json") -> subprocess.CompletedProcess[str]:
    assert RABBITMQADMIN is not None
    return subprocess.run([RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(port), "-u", user, "-p", password,
                           "-f", fmt, *args], capture_output=True, text=True, timeout=60)


def admin_ok(port: int, *args: str) -> str:
    done = admin(port, *args)
    assert done.returncode == 0, f"rabbitmqadmin {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def eventually(what: str, check: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + WAIT_S
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.1)


def test_rabbitmqadmin_declares_publishes_gets_and_deletes(amqp_target: Target, uid: str) -> None:
    ports = management_ports(amqp_target)
    first, last = ports[0], ports[-1]
    queue, exchange = f"adm-q-{uid}", f"adm-x-{uid}"
    assert admin_ok(first, "declare", "exchange", f"name={exchange}", "type=topic") == "exchange declared\n"
    admin_ok(first, "declare", "queue", f"name={queue}", "durable=true")
    admin_ok(first, "declare", "binding", f"source={exchange}", f"destination={queue}", "routing_key=a.*")
    mine = [b for b in json.loads(admin_ok(last, "list", "bindings")) if b["source"] == exchange]
    assert mine == [{"source": exchange, "vhost": "/", "destination": queue, "destination_type": "queue",
                     "routing_key": "a.*", "arguments": {}, "properties_key": "a.%2A"}]

    done = admin(first, "publish", f"exchange={exchange}", "routing_key=a.b", "payload=hello", fmt="table")
    assert done.stdout == "Message published\n", done.stderr
    done = admin(first, "publish", f"exchange={exchange}", "routing_key=zzz", "payload=lost", fmt="table")
    assert done.stdout == "Message published but NOT routed\n", done.stderr
    got = json.loads(admin_ok(last, "get", f"queue={queue}", "ackmode=ack_requeue_true"))
    assert [(m["payload"], m["routing_key"], m["exchange"], m["redelivered"], m["payload_encoding"])
            for m in got] == [("hello", "a.b", exchange, False, "string")]
    got = json.loads(admin_ok(last, "get", f"queue={queue}", "ackmode=ack_requeue_false", "count=5"))
    assert [(m["payload"], m["redelivered"], m["message_count"]) for m in got] == [("hello", True, 0)]
    assert json.loads(admin_ok(first, "get", f"queue={queue}", "ackmode=ack_requeue_false")) == []

    admin_ok(first, "publish", "routing_key=" + queue, "payload=purged")  # the default exchange (amq.default)
    assert admin_ok(first, "purge", "queue", f"name={queue}") == "queue purged\n"
    assert json.loads(admin_ok(first, "get", f"queue={queue}", "ackmode=ack_requeue_false")) == []

    admin_ok(first, "delete", "binding", f"source={exchange}", f"destination={queue}", "destination_type=queue",
             "properties_key=a.%2A")
    assert not [b for b in api(last, "GET", "/api/bindings").json() if b["source"] == exchange]
    admin_ok(first, "delete", "queue", f"name={queue}")
    admin_ok(first, "delete", "exchange", f"name={exchange}")
    done = admin(first, "delete", "queue", f"name={queue}")
    assert done.returncode != 0 and f"Not found: /api/queues/%2F/{queue}" in done.stdout + done.stderr


def test_errors_have_rabbitmqs_status_and_reason(amqp_target: Target, uid: str) -> None:
    port = management_ports(amqp_target)[0]
    queue = f"adm-err-{uid}"
    assert api(port, "PUT", f"/api/queues/%2F/{queue}", {"durable": True}).status_code == 201
    assert api(port, "PUT", f"/api/queues/%2F/{queue}", {"durable": True}).status_code == 204
    reply = api(port, "PUT", f"/api/queues/%2F/{queue}", {"durable": False})
    assert reply.status_code == 400 and reply.json() == {"error": "bad_request", "reason": (
        f"inequivalent arg 'durable' for queue '{queue}' in vhost '/': received 'false' but current is 'true'")}
    reply = api(port, "POST", "/api/queues/%2F/no-such-queue-" + uid + "/get",
                {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
    assert reply.status_code == 404 and reply.json()["error"] == "not_found"
    reply = api(port, "POST", "/api/exchanges/%2F/amq.default/publish", {"routing_key": queue})
    assert reply.status_code == 400 and reply.json()["reason"] == (
        "[{key_missing,properties},\n {key_missing,payload},\n {key_missing,payload_encoding}]")
    reply = api(port, "POST", f"/api/exchanges/%2F/no-such-x-{uid}/publish",
                {"routing_key": "k", "properties": {}, "payload": "x", "payload_encoding": "string"})
    assert reply.status_code == 400 and reply.json()["reason"] == f"404 NOT_FOUND - no exchange 'no-such-x-{uid}' in vhost '/'"
    assert api(port, "PUT", f"/api/queues/no-such-vhost-{uid}/q", {}).status_code == 404
    reply = api(port, "PUT", f"/api/queues/%2F/{queue}-b", {"auto_delete": "maybe"})
    assert reply.status_code == 400 and reply.json()["reason"] == ["not_boolean", "maybe"]
    assert api(port, "DELETE", f"/api/queues/%2F/{queue}").status_code == 204


def test_channels_consumers_health_and_limits(amqp_target: Target, uid: str) -> None:
    ports = management_ports(amqp_target)
    queue = f"adm-c-{uid}"
    with pika.BlockingConnection(amqp_target.params(client_properties={"connection_name": uid})) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.basic_qos(prefetch_count=7)
        ch.basic_consume(queue, lambda *a: None, consumer_tag=f"ctag-{uid}")
        eventually("the consumer", lambda: [c for c in api(ports[0], "GET", "/api/consumers").json()
                                            if c["consumer_tag"] == f"ctag-{uid}"])
        for port in ports:  # every node answers for the whole cluster
            channels = [c for c in json.loads(admin_ok(port, "list", "channels")) if c["consumer_count"] == 1
                        and c["user"] == "guest" and c["prefetch_count"] == 7]
            assert channels, port
            consumers = [c for c in json.loads(admin_ok(port, "list", "consumers"))
                         if c["consumer_tag"] == f"ctag-{uid}"]
            assert consumers and consumers[0]["queue"] == {"name": queue, "vhost": "/"}, port
        # an exclusive queue lives on its owner's node only: every node shows the owner's figures (as RabbitMQ)
        ch.queue_declare(f"{queue}-excl", exclusive=True)
        ch.basic_publish("", f"{queue}-excl", b"held")
        ch.basic_consume(f"{queue}-excl", lambda *a: None, consumer_tag=f"ctag-x-{uid}")
        conn.process_data_events(time_limit=0.1)  # (the consumer holds the message unacked)
        for port in ports:
            row = eventually("the exclusive queue's owner figures", lambda p=port: _owner_figures(
                api(p, "GET", f"/api/queues/%2F/{queue}-excl").json()))
            assert row["exclusive"] and row["messages_unacknowledged"] == 1, (port, row)
            listed = [r for r in json.loads(admin_ok(port, "list", "queues", "name", "consumers", "messages"))
                      if r["name"] == f"{queue}-excl"]
            assert listed == [{"name": f"{queue}-excl", "consumers": 1, "messages": 1}], port
        ch.queue_delete(queue)
    port = ports[-1]
    for path in ("/api/aliveness-test/%2F", "/api/healthchecks/node", "/api/health/checks/alarms"):
        reply = api(port, "GET", path)
        assert (reply.status_code, reply.json()) == (200, {"status": "ok"}), path
    assert api(port, "GET", "/api/whoami").json() == {"name": "guest", "tags": ["administrator"]}
    assert api(port, "GET", "/api/user-limits").json() == []


def _owner_figures(row: dict[str, Any]) -> dict[str, Any] | None:
    """The row once it shows the owner's figures (a node may not have the queue yet: 404 until it mirrors it)."""
    return row if row.get("consumers") == 1 and row.get("messages") == 1 else None


def test_export_and_import_definitions(amqp_target: Target, uid: str, tmp_path: Path) -> None:
    ports = management_ports(amqp_target)
    vhost = f"adm-defs-{uid}"
    definitions = {
        "users": [{"name": f"adm-user-{uid}", "password_hash": "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR",
                   "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": "management", "limits": {}}],
        "vhosts": [{"name": vhost}],
        "permissions": [{"user": "guest", "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"}],
        "policies": [{"vhost": vhost, "name": "ttl", "pattern": "^q", "apply-to": "queues",
                      "definition": {"message-ttl": 60000}, "priority": 0}],
        "queues": [{"name": "q1", "vhost": vhost, "durable": True, "auto_delete": False, "arguments": {}}],
        "exchanges": [{"name": "x1", "vhost": vhost, "type": "fanout", "durable": True, "auto_delete": False,
                       "internal": False, "arguments": {}}],
        "bindings": [{"source": "x1", "vhost": vhost, "destination": "q1", "destination_type": "queue",
                      "routing_key": "", "arguments": {}}],
    }
    path = tmp_path / "in.json"
    path.write_text(json.dumps(definitions))
    admin_ok(ports[0], "import", str(path))
    out = tmp_path / "out.json"
    exported = _export_has(ports[-1], out, vhost)  # (read through another node at once: a read barrier)
    assert exported is not None
    assert {"name": "q1", "vhost": vhost, "durable": True, "auto_delete": False, "arguments": {}} in \
        exported["queues"]
    assert {"source": "x1", "vhost": vhost, "destination": "q1", "destination_type": "queue",
            "routing_key": "", "arguments": {}} in exported["bindings"]
    user = next(u for u in exported["users"] if u["name"] == f"adm-user-{uid}")
    assert user["password_hash"] == definitions["users"][0]["password_hash"] and user["tags"] == ["management"]
    assert [p["name"] for p in exported["policies"] if p["vhost"] == vhost] == ["ttl"]
    assert api(ports[0], "DELETE", f"/api/queues/{quote(vhost)}/q1").status_code == 204
    assert api(ports[0], "DELETE", f"/api/exchanges/{quote(vhost)}/x1").status_code == 204


def _export_has(port: int, out: Path, vhost: str) -> dict[str, Any] | None:
    if not [b for b in api(port, "GET", "/api/bindings").json() if b["vhost"] == vhost and b["source"] == "x1"]:
        return None  # (not there: nothing to export)
    admin_ok(port, "export", str(out))
    exported: dict[str, Any] = json.loads(out.read_text())
    names = {(b["vhost"], b["source"]) for b in exported["bindings"]}
    return exported if (vhost, "x1") in names and any(q["vhost"] == vhost for q in exported["queues"]) else None


def _closed_by_broker(conn: pika.BlockingConnection) -> tuple[int, str]:
    """Wait until the broker closes `conn`; its (reply code, reply text)."""
    deadline = time.monotonic() + WAIT_S
    try:
        while time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.1)
    except pika.exceptions.ConnectionClosedByBroker as exc:
        return exc.reply_code, exc.reply_text
    raise AssertionError("the broker never closed the connection")


def test_rabbitmqadmin_deletes_users_permissions_and_vhosts(amqp_target: Target, uid: str) -> None:
    """As RabbitMQ 3.10: 204 and gone on every node; 404 for what does not exist; a deleted user's permissions go
    with it and its connections are closed (320), as are the connections into a deleted vhost."""
    ports = management_ports(amqp_target)
    first, last = ports[0], ports[-1]
    vhost, user, other = f"adm-vh-{uid}", f"adm-du-{uid}", f"adm-du2-{uid}"
    assert api(first, "PUT", f"/api/vhosts/{vhost}").status_code == 201  # (set up over HTTP: cheaper)
    for name in (user, other, "guest"):
        if name != "guest":
            assert api(first, "PUT", f"/api/users/{name}", {"password": "pw", "tags": ""}).status_code == 201
        assert api(first, "PUT", f"/api/permissions/{vhost}/{name}",
                   {"configure": ".*", "write": ".*", "read": ".*"}).status_code == 201
    assert api(first, "PUT", f"/api/queues/{vhost}/q", {"durable": True}).status_code == 201
    assert api(first, "POST", f"/api/exchanges/{vhost}/amq.default/publish", {
        "routing_key": "q", "properties": {}, "payload": "doomed", "payload_encoding": "string"}).json() == {
        "routed": True}
    assert api(last, "GET", f"/api/permissions/{quote(vhost)}/{user}").status_code == 200

    with pika.BlockingConnection(amqp_target.params(user=user, password="pw", vhost=vhost)) as conn:
        admin_ok(first, "delete", "user", f"name={user}")
        assert _closed_by_broker(conn) == (320, f"CONNECTION_FORCED - user '{user}' is deleted")
    assert api(last, "GET", f"/api/users/{user}").status_code == 404
    assert user not in {u["name"] for u in json.loads(admin_ok(last, "list", "users"))}
    assert api(last, "GET", f"/api/permissions/{quote(vhost)}/{user}").status_code == 404
    done = admin(first, "delete", "user", f"name={user}")
    assert done.returncode != 0 and f"Not found: /api/users/{user}" in done.stdout + done.stderr

    admin_ok(first, "delete", "permission", f"vhost={vhost}", f"user={other}")
    assert api(last, "GET", f"/api/permissions/{quote(vhost)}/{other}").status_code == 404
    assert api(first, "DELETE", f"/api/permissions/{quote(vhost)}/{other}").status_code == 404
    reply = api(first, "POST", "/api/users/bulk-delete", {"users": [other, f"no-such-{uid}"]})
    assert (reply.status_code, reply.json()) == (400, {"error": "bad_request",  # as RabbitMQ 3.10: stops there
                                                       "reason": ["no_such_user", f"no-such-{uid}"]})
    assert api(last, "GET", f"/api/users/{other}").status_code == 404

    with pika.BlockingConnection(amqp_target.params(vhost=vhost)) as conn:
        admin_ok(first, "delete", "vhost", f"name={vhost}")
        assert _closed_by_broker(conn) == (320, f"CONNECTION_FORCED - vhost '{vhost}' is down")  # (as RabbitMQ 3.10)
    for port in ports:  # gone on every node at once (cluster: each read passes a metadata read barrier)
        assert api(port, "GET", f"/api/vhosts/{quote(vhost)}").status_code == 404
        assert not [q for q in api(port, "GET", "/api/queues").json() if q["vhost"] == vhost]
    done = admin(first, "delete", "vhost", f"name={vhost}")
    assert done.returncode != 0 and "Not found" in done.stdout + done.stderr
