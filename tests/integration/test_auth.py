"""Authentication, vhost access and permissions, as RabbitMQ answers them."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest

from tests.integration.conftest import Target
from tests.integration.helpers import drain, expect_channel_error, publish
from tests.integration.nodeproc import LIMITED_USER, PRIVATE_USER, PRIVATE_VHOST


def test_wrong_password_is_refused(amqp_target: Target) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        pika.BlockingConnection(amqp_target.params("guest", "wrong"))
    assert "ACCESS_REFUSED" in str(info.value)


def test_unknown_user_is_refused(amqp_target: Target) -> None:
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(amqp_target.params("nobody-at-all", "pw"))


def test_vhost_without_permission_is_530(amqp_target: Target) -> None:
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        pika.BlockingConnection(amqp_target.params("guest", "guest", vhost=PRIVATE_VHOST))
    assert "(530)" in str(info.value)
    assert f"'{PRIVATE_VHOST}'" in str(info.value)


def test_missing_vhost_is_530(amqp_target: Target) -> None:
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        pika.BlockingConnection(amqp_target.params(vhost="no-such-vhost"))
    assert "(530)" in str(info.value)


def test_user_with_vhost_permission_gets_in(amqp_target: Target) -> None:
    connection = pika.BlockingConnection(amqp_target.params(*PRIVATE_USER, vhost=PRIVATE_VHOST))
    try:
        ch = connection.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        publish(ch, "", q, b"private")
        assert drain(ch, q) == [b"private"]
    finally:
        connection.close()


def test_vhosts_are_isolated(amqp_target: Target, uid: str) -> None:
    private = pika.BlockingConnection(amqp_target.params(*PRIVATE_USER, vhost=PRIVATE_VHOST))
    default = pika.BlockingConnection(amqp_target.params())
    try:
        private.channel().queue_declare(f"it-iso-{uid}", auto_delete=True)
        expect_channel_error(404, lambda: default.channel().queue_declare(f"it-iso-{uid}", passive=True))
    finally:
        private.close()
        default.close()


def test_configure_permission_is_checked(amqp_target: Target, uid: str) -> None:
    connection = pika.BlockingConnection(amqp_target.params(*LIMITED_USER))
    try:
        ch = connection.channel()
        ch.queue_declare(f"it-limited-{uid}", exclusive=True)  # matches ^it-limited-.*
        error = expect_channel_error(403, lambda: connection.channel().queue_declare(f"other-{uid}", exclusive=True))
        assert "refused for user 'it-limited'" in error.reply_text
        expect_channel_error(403, lambda: connection.channel().exchange_declare(f"other-{uid}", "direct"))
    finally:
        connection.close()


def test_write_and_read_permissions_are_checked(amqp_target: Target, uid: str) -> None:
    connection = pika.BlockingConnection(amqp_target.params(*LIMITED_USER))
    admin = pika.BlockingConnection(amqp_target.params())
    try:
        admin_ch = admin.channel()
        admin_ch.queue_declare(f"other-{uid}", auto_delete=True)
        admin_ch.basic_consume(f"other-{uid}", lambda *a: None)  # keeps the auto-delete queue alive
        ch = connection.channel()
        mine = ch.queue_declare(f"it-limited-{uid}", exclusive=True).method.queue
        # Binding needs write on the queue and read on the exchange; amq.direct is not writable by this user.
        ch.queue_bind(mine, "amq.direct", "k")
        ch.basic_publish("amq.direct", "k", b"x")
        error = expect_channel_error(403, lambda: ch.queue_declare(mine, passive=True))
        assert "access to exchange 'amq.direct'" in error.reply_text
        ch = connection.channel()
        expect_channel_error(403, lambda: ch.queue_bind(f"other-{uid}", "amq.direct", "k"))
        # Reading any queue is allowed (read = .*): basic.get on another queue works.
        assert connection.channel().basic_get(f"other-{uid}") == (None, None, None)
    finally:
        connection.close()
        admin.close()


def test_guest_is_loopback_only_by_default(own_node: Target) -> None:
    """Connecting through a non-loopback address would be refused; here we only check loopback works."""
    connection = pika.BlockingConnection(own_node.params())
    assert connection.is_open
    connection.close()
