"""Users, password hashes, permissions and login rules."""

from __future__ import annotations

import base64
import hashlib

from node.amqp import methods as m
from node.broker.auth import Permission, check_password, hash_password
from tests.broker.harness import Client, bodies, channel_close, connected, new_broker, of_type


def test_hash_is_rabbitmq_sha256_format() -> None:
    salt = b"\x01\x02\x03\x04"
    encoded = hash_password("secret", salt)
    raw = base64.b64decode(encoded)
    assert raw[:4] == salt and raw[4:] == hashlib.sha256(salt + b"secret").digest()
    assert check_password("secret", encoded)
    assert not check_password("wrong", encoded)
    assert not check_password("secret", "not base64!")


def test_guest_only_from_loopback() -> None:
    broker = new_broker()
    broker.open_connection(1, "127.0.0.1", True)
    broker.open_connection(2, "10.0.0.5", False)
    assert broker.authenticator_for(1).authenticate("PLAIN", b"\x00guest\x00guest") == "guest"
    assert broker.authenticator_for(2).authenticate("PLAIN", b"\x00guest\x00guest") is None
    assert broker.authenticator_for(1).authenticate("PLAIN", b"\x00guest\x00bad") is None
    assert broker.authenticate("PLAIN", b"\x00guest\x00guest") is None


def test_amqplain_and_other_users_remote() -> None:
    broker = new_broker()
    broker.add_user("bob", "pw")
    broker.open_connection(2, "10.0.0.5", False)
    table = b"\x05LOGINS\x00\x00\x00\x03bob\x08PASSWORDS\x00\x00\x00\x02pw"
    assert broker.authenticator_for(2).authenticate("AMQPLAIN", table) == "bob"
    assert not broker.vhost_access("bob", "/")
    broker.set_permissions("bob", "/", Permission())
    assert broker.vhost_access("bob", "/")
    assert not broker.vhost_access("bob", "/nope")


def _bob(configure: str, write: str, read: str):  # type: ignore[no-untyped-def]
    broker = new_broker()
    broker.add_user("bob", "pw")
    broker.set_permissions("bob", "/", Permission(configure, write, read))
    guest = connected(broker, 1)
    bob = connected(broker, 2, user="bob")
    return guest, bob


def test_declare_needs_configure() -> None:
    _guest, bob = _bob("^mine", ".*", ".*")
    assert of_type(bob.declare("mine.q"), m.QueueDeclareOk)
    assert channel_close(bob.declare("other")) == (
        403, "ACCESS_REFUSED - configure access to queue 'other' in vhost '/' refused for user 'bob'")


def test_publish_needs_write_on_exchange_default_is_amq_default() -> None:
    _guest, bob = _bob(".*", "", ".*")
    assert channel_close(bob.publish("", "q")) == (
        403, "ACCESS_REFUSED - write access to exchange 'amq.default' in vhost '/' refused for user 'bob'")


def test_bind_needs_write_on_queue_and_read_on_exchange() -> None:
    guest, bob = _bob(".*", "^q$", "^nothing$")
    guest.declare("q")
    assert channel_close(bob.bind("q", "amq.direct", "k")) == (
        403, "ACCESS_REFUSED - read access to exchange 'amq.direct' in vhost '/' refused for user 'bob'")


def test_consume_get_purge_need_read() -> None:
    guest, bob = _bob(".*", ".*", "")
    guest.declare("q")
    expected = (403, "ACCESS_REFUSED - read access to queue 'q' in vhost '/' refused for user 'bob'")
    assert channel_close(bob.consume("q")) == expected
    bob.open(1)
    assert channel_close(bob.call(m.BasicGet(queue="q"))) == expected
    bob.open(1)
    assert channel_close(bob.call(m.QueuePurge(queue="q"))) == expected


def test_delete_needs_configure() -> None:
    guest, bob = _bob("^x$", ".*", ".*")
    guest.declare("q")
    assert channel_close(bob.call(m.QueueDelete(queue="q")))[0] == 403


def test_publish_permission_cache_follows_permission_changes() -> None:
    guest, bob = _bob(".*", ".*", ".*")
    guest.declare("q")
    assert bob.publish("", "q") == []
    bob.broker.set_permissions("bob", "/", Permission(".*", "^amq\\.direct$", ".*"))
    assert channel_close(bob.publish("", "q")) == (
        403, "ACCESS_REFUSED - write access to exchange 'amq.default' in vhost '/' refused for user 'bob'")


LINK = ("raftmq-internal-link", "link-pw")


def test_the_link_login_needs_no_user_and_may_do_everything_in_any_existing_vhost() -> None:
    """`amqp://` shovels and federation links log in with it (cluster/authlink/amqp_login.py), as RabbitMQ's internal
    user "none" needs no password and may do everything: checked before the user table, never against it."""
    broker = new_broker(link_login=LINK)
    broker.add_user(LINK[0], "table-pw")  # a user of the same name in the table is never asked
    broker.add_vhost("v2")  # no permissions for anyone
    broker.open_connection(5, "10.0.0.9", False)
    auth = broker.authenticator_for(5)
    assert auth.authenticate("PLAIN", f"\0{LINK[0]}\0table-pw".encode()) is None
    assert not broker.conns[5].link
    assert auth.authenticate("PLAIN", f"\0{LINK[0]}\0{LINK[1]}".encode()) == LINK[0]  # (from any host)
    assert broker.conns[5].link and not broker.conns[5].internal
    assert auth.vhost_access(LINK[0], "v2") and not auth.vhost_access(LINK[0], "no-such-vhost")
    link = Client(broker, 6, user=LINK[0], vhost="v2")
    assert broker.authenticator_for(6).authenticate("PLAIN", f"\0{LINK[0]}\0{LINK[1]}".encode()) == LINK[0]
    link.open(1)
    assert of_type(link.declare("q"), m.QueueDeclareOk)  # configure
    assert of_type(link.bind("q", "amq.direct", "k"), m.QueueBindOk)  # write on the queue, read on the exchange
    assert link.publish("amq.direct", "k", b"moved") == []  # write
    assert bodies(link.consume("q")) == [b"moved"]  # read
    assert new_broker().authenticator_for(1).authenticate("PLAIN", f"\0{LINK[0]}\0{LINK[1]}".encode()) is None
