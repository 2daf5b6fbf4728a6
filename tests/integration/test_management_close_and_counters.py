"""Management leftovers on real nodes in both modes: `DELETE /api/connections/{name}` (320 CONNECTION_FORCED with
the X-Reason header as the reason; in cluster mode asked of a node that does not hold the connection, which the
holder then closes), the cluster-wide /api/nodes (memory and disk of every node) and /api/overview message counts,
and the routed / unroutable / confirmed Prometheus counters, which only grow while channels come and go."""

from __future__ import annotations

from urllib.parse import quote

import pika
import pytest
import requests
from pika.exceptions import ConnectionClosedByBroker, UnroutableError

from tests.integration.conftest import Target
from tests.integration.test_management_rabbitmqadmin import eventually
from tests.integration.test_prometheus_metrics import scrape, total
from tests.integration.test_vhost_limits import management_ports


def _api(port: int, method: str, path: str, **kwargs: object) -> requests.Response:
    return requests.request(method, f"http://127.0.0.1:{port}{path}", auth=("guest", "guest"), timeout=30,
                            **kwargs)  # type: ignore[arg-type]


def test_delete_connection_closes_it_with_320_and_the_reason(amqp_target: Target, uid: str) -> None:
    ports = management_ports(amqp_target)
    user = f"closer-{uid}"
    assert _api(ports[0], "PUT", f"/api/users/{user}", json={"password": "pw", "tags": ""}).status_code in (201, 204)
    assert _api(ports[0], "PUT", f"/api/permissions/%2F/{user}",
                json={"configure": ".*", "write": ".*", "read": ".*"}).status_code in (201, 204)
    conn = pika.BlockingConnection(amqp_target.params(user, "pw"))
    try:
        rows = eventually("the connection's row", lambda: [
            r for r in _api(ports[0], "GET", "/api/connections").json() if r["user"] == user] or None)
        assert len(rows) == 1
        name = rows[0]["name"]
        # in cluster mode, ask a node that does not hold the connection: it forwards to the one that does
        others = [p for p, n in zip(ports, _node_names(amqp_target, ports), strict=True) if n != rows[0]["node"]]
        port = others[0] if others else ports[0]
        assert _api(port, "DELETE", f"/api/connections/{quote('no such connection', safe='')}").status_code == 404
        reply = _api(port, "DELETE", f"/api/connections/{quote(name, safe='')}", headers={"X-Reason": f"bye {uid}"})
        assert reply.status_code == 204, reply.text
        with pytest.raises(ConnectionClosedByBroker) as closed:
            for _ in range(100):
                conn.process_data_events(time_limit=0.1)
        assert closed.value.reply_code == 320
        assert closed.value.reply_text == f"CONNECTION_FORCED - bye {uid}"
        eventually("the row to go", lambda: not [r for r in _api(ports[0], "GET", "/api/connections").json()
                                                if r["user"] == user] or None)
    finally:
        if conn.is_open:
            conn.close()


def _node_names(target: Target, ports: list[int]) -> list[str]:
    """The node name behind each management port (from each node's own /api/overview)."""
    return [_api(port, "GET", "/api/overview", params={"raftmq_local": "true"}).json()["node"] for port in ports]


def test_nodes_and_overview_cover_every_node(amqp_target: Target) -> None:
    ports = management_ports(amqp_target)
    nodes = _api(ports[-1], "GET", "/api/nodes").json()
    assert len(nodes) == len(ports)
    for node in nodes:  # every running node's own memory and disk figures, as RabbitMQ's /api/nodes has them
        assert node["running"] and node["mem_used"] > 0 and node["mem_limit"] > 0, node
        assert node["disk_free"] > 0 and "disk_free_limit" in node and node["mem_alarm"] is False, node
    received = total(ports, "rabbitmq_global_messages_received_total")
    stats = _api(ports[-1], "GET", "/api/overview").json()["message_stats"]
    assert set(stats) >= {"publish", "deliver_get", "confirm"}
    assert stats["publish"] >= received  # every node's count, added up by the node asked
    with pika.BlockingConnection(amqp_target.params()) as conn:
        conn.channel()
        for port in ports:  # the client's connection counts on every node's overview, whichever node holds it
            totals = _api(port, "GET", "/api/overview").json()["object_totals"]
            assert totals["connections"] >= 1 and totals["channels"] >= 1, (port, totals)


def test_routed_unroutable_and_confirmed_counters_only_grow(amqp_target: Target, uid: str) -> None:
    ports = management_ports(amqp_target)
    names = ("rabbitmq_global_messages_routed_total", "rabbitmq_global_messages_unroutable_dropped_total",
             "rabbitmq_global_messages_unroutable_returned_total", "rabbitmq_global_messages_confirmed_total")
    before = _totals(ports, names)
    queue = f"prom-routed-{uid}"
    with pika.BlockingConnection(amqp_target.params()) as conn:
        conn.channel().queue_declare(queue, durable=True)
        for _ in range(3):  # each channel publishes, confirms and closes: the counters must not fall with it
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish("", queue, b"routed")
            ch.basic_publish("", f"nowhere-{uid}", b"dropped")
            with pytest.raises(UnroutableError):
                ch.basic_publish("", f"nowhere-{uid}", b"returned", mandatory=True)
            ch.close()
            now = _totals(ports, names)
            assert all(now[name] >= before[name] for name in names), (before, now)
        conn.channel().queue_delete(queue)
    after = _totals(ports, names)
    assert after[names[0]] >= before[names[0]] + 3
    assert after[names[1]] >= before[names[1]] + 3
    assert after[names[2]] >= before[names[2]] + 3
    assert after[names[3]] >= before[names[3]] + 9  # every publish is confirmed, routed or not


def _totals(ports: list[int], names: tuple[str, ...]) -> dict[str, float]:
    """Each counter summed over the nodes, as Prometheus would (one scrape per node)."""
    scrapes = [scrape(port) for port in ports]
    return {name: sum(samples.get((name, ()), 0.0) for samples in scrapes) for name in names}


def test_user_limits_are_enforced_with_rabbitmqs_errors(amqp_target: Target, uid: str) -> None:
    ports = management_ports(amqp_target)
    user = f"limited-{uid}"
    assert _api(ports[0], "PUT", f"/api/users/{user}", json={"password": "pw", "tags": ""}).status_code in (201, 204)
    assert _api(ports[0], "PUT", f"/api/permissions/%2F/{user}",
                json={"configure": ".*", "write": ".*", "read": ".*"}).status_code in (201, 204)
    limits = f"/api/user-limits/{user}"
    assert _api(ports[0], "PUT", f"{limits}/max-connections", json={"value": 1}).status_code == 204
    assert _api(ports[0], "PUT", f"{limits}/max-channels", json={"value": 2}).status_code == 204
    assert _api(ports[0], "PUT", f"{limits}/max-queues", json={"value": 2}).status_code == 400
    assert _api(ports[0], "PUT", f"{limits}/max-channels", json={"value": "x"}).status_code == 400
    assert _api(ports[0], "PUT", f"/api/user-limits/nobody-{uid}/max-channels", json={"value": 1}).status_code == 404
    try:
        expected = [{"user": user, "value": {"max-connections": 1, "max-channels": 2}}]
        for port in ports:  # every node knows the limits at once (cluster: a read passes a metadata read barrier)
            assert _api(port, "GET", limits).json() == expected
            row = next(u for u in _api(port, "GET", "/api/users").json() if u["name"] == user)
            assert row["limits"] == expected[0]["value"]
        exported = next(u for u in _api(ports[-1], "GET", "/api/definitions").json()["users"] if u["name"] == user)
        assert exported["limits"] == expected[0]["value"]  # definitions carry them both ways, as RabbitMQ 3.10's
        imported = f"imported-{uid}"
        assert _api(ports[-1], "POST", "/api/definitions", json={"users": [{
            "name": imported, "password_hash": "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR",
            "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": "",
            "limits": {"max-channels": 3}}]}).status_code in (200, 201, 204)
        # cluster: the import committed through the metadata group; another node reads it at once
        assert _api(ports[0], "GET", f"/api/user-limits/{imported}").json() == [
            {"user": imported, "value": {"max-channels": 3}}]
        assert _api(ports[0], "DELETE", f"/api/user-limits/{imported}/max-channels").status_code == 204
        conn = pika.BlockingConnection(amqp_target.params(user, "pw"))
        try:
            with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
                _second_connection_on_the_same_node(amqp_target, user)
            assert "user connection limit (1) is reached" in str(refused.value)
            conn.channel()
            conn.channel()
            with pytest.raises(ConnectionClosedByBroker) as closed:
                conn.channel()
            assert closed.value.reply_code == 530
            assert closed.value.reply_text == (f"NOT_ALLOWED - number of channels opened for user '{user}' has "
                                               "reached the maximum allowed user limit of (2)")
        finally:
            if conn.is_open:
                conn.close()
        assert _api(ports[-1], "DELETE", f"{limits}/max-connections").status_code == 204
        assert _api(ports[0], "GET", limits).json() == [{"user": user, "value": {"max-channels": 2}}]
    finally:
        _api(ports[-1], "DELETE", f"{limits}/max-connections")
        _api(ports[-1], "DELETE", f"{limits}/max-channels")
        _api(ports[-1], "DELETE", f"/api/user-limits/imported-{uid}/max-channels")
    assert all(_api(p, "GET", "/api/user-limits").json() == [] for p in ports)


def _second_connection_on_the_same_node(target: Target, user: str) -> None:
    """A second connection of `user` to the node that holds the first (max-connections counts per node)."""
    if target.mode == "cluster":
        rows = [r for r in _api(management_ports(target)[0], "GET", "/api/connections").json() if r["user"] == user]
        node = next(n for n in target.node.nodes if n.plan.name == rows[0]["node"])  # type: ignore[union-attr]
        params = pika.ConnectionParameters(node.plan.host, node.plan.port, credentials=pika.PlainCredentials(
            user, "pw"), connection_attempts=1)
    else:
        params = target.params(user, "pw")
    pika.BlockingConnection(params).close()
