"""Shovels and federation links whose URI is `amqp://` (no host: the node itself) log in with the links' own login
(cluster/authlink/amqp_login.py), never as guest: with guest's password changed, a shovel and an exchange
federation link on `amqp://` still move messages, in both modes; and no client logs in as the link identity.

The test changes guest's password on the session's broker, so it works in a vhost of its own (guest has no
permissions there either) as an administrator of its own, and gives guest its password back at the end, waiting
until every node takes it again before the next test."""

from __future__ import annotations

from typing import Any

import pika
import pika.exceptions
import pytest
import requests

from cluster.authlink.amqp_login import LINK_USER, link_login
from tests.integration.conftest import Target
from tests.integration.test_management_rabbitmqadmin import eventually
from tests.integration.test_vhost_limits import amqp_ports, management_ports

MOVED = 10


def _api(port: int, method: str, path: str, auth: tuple[str, str], body: Any = None) -> requests.Response:
    return requests.request(method, f"http://127.0.0.1:{port}{path}", json=body, auth=auth, timeout=30)


def _ok(reply: requests.Response) -> None:
    assert reply.status_code in (200, 201, 204), (reply.status_code, reply.text)


def _count(target: Target, admin: tuple[str, str], vhost: str, queue: str) -> int:
    with pika.BlockingConnection(target.params(*admin, vhost=vhost)) as conn:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)


def _logs_in(target: Target, port: int, user: str, password: str, vhost: str = "/") -> bool:
    try:
        pika.BlockingConnection(pika.ConnectionParameters(
            target.host, port, vhost, credentials=pika.PlainCredentials(user, password), connection_attempts=1)).close()
    except pika.exceptions.AMQPConnectionError:
        return False
    return True


def test_amqp_links_move_messages_with_guests_password_changed(amqp_target: Target, uid: str) -> None:
    ports = management_ports(amqp_target)
    guest, admin = ("guest", "guest"), (f"links-admin-{uid}", "pw")
    src, dst, up_x, down_x, fed_q = (f"links-{what}-{uid}" for what in ("src", "dst", "up-x", "down-x", "fed-q"))
    vhost, shovel, upstream, policy = f"links-{uid}", f"links-s-{uid}", f"links-up-{uid}", f"links-p-{uid}"
    local = f"amqp:///{vhost}"  # the node itself, in the test's vhost
    _ok(_api(ports[0], "PUT", f"/api/vhosts/{vhost}", guest))
    _ok(_api(ports[0], "PUT", f"/api/users/{admin[0]}", guest, {"password": admin[1], "tags": "administrator"}))
    _ok(_api(ports[0], "PUT", f"/api/permissions/{vhost}/{admin[0]}", guest,
             {"configure": ".*", "write": ".*", "read": ".*"}))
    try:
        eventually("the administrator on every node", lambda: all(
            _logs_in(amqp_target, port, *admin, vhost) for port in amqp_ports(amqp_target)))
        _ok(_api(ports[0], "PUT", "/api/users/guest", admin, {"password": f"changed-{uid}", "tags": "administrator"}))
        eventually("guest's old password refused", lambda: not _logs_in(amqp_target, amqp_target.port, *guest))
        with pika.BlockingConnection(amqp_target.params(*admin, vhost=vhost)) as conn:
            ch = conn.channel()
            for queue in (src, dst, fed_q):
                ch.queue_declare(queue, durable=True)
            ch.exchange_declare(up_x, "fanout", durable=True)
            ch.exchange_declare(down_x, "fanout", durable=True)
            ch.queue_bind(fed_q, down_x)
            for n in range(MOVED):
                ch.basic_publish("", src, f"s{n}".encode(), pika.BasicProperties(delivery_mode=2))
        _ok(_api(ports[0], "PUT", f"/api/parameters/shovel/{vhost}/{shovel}", admin, {"value": {
            "src-uri": local, "src-queue": src, "dest-uri": local, "dest-queue": dst}}))
        _ok(_api(ports[0], "PUT", f"/api/parameters/federation-upstream/{vhost}/{upstream}", admin, {"value": {
            "uri": local, "exchange": up_x}}))
        _ok(_api(ports[0], "PUT", f"/api/policies/{vhost}/{policy}", admin, {
            "pattern": f"^{down_x}$", "definition": {"federation-upstream": upstream}, "apply-to": "exchanges"}))
        eventually("the shovelled messages", lambda: _count(amqp_target, admin, vhost, dst) == MOVED)

        def federated() -> bool:  # (published until the link has bound its queue upstream, then counted)
            with pika.BlockingConnection(amqp_target.params(*admin, vhost=vhost)) as conn:
                conn.channel().basic_publish(up_x, "", b"f")
            return _count(amqp_target, admin, vhost, fed_q) > 0

        eventually("a message through the federation link", federated)
    finally:
        _ok(_api(ports[0], "PUT", "/api/users/guest", admin, {"password": "guest", "tags": "administrator"}))
        eventually("guest's password back on every node", lambda: all(
            _logs_in(amqp_target, port, *guest) for port in amqp_ports(amqp_target)))
        for path in (f"/api/policies/{vhost}/{policy}", f"/api/parameters/federation-upstream/{vhost}/{upstream}",
                     f"/api/parameters/shovel/{vhost}/{shovel}", f"/api/vhosts/{vhost}", f"/api/users/{admin[0]}"):
            _api(ports[0], "DELETE", path, guest)


@pytest.mark.parametrize("password", ["guest", "", link_login(b"guessed key")[1]])
def test_no_client_logs_in_as_the_link_identity(amqp_target: Target, password: str) -> None:
    """Its password is derived from a random key of the node process (node/runtime/main.py): never known outside."""
    assert not _logs_in(amqp_target, amqp_target.port, LINK_USER, password)
