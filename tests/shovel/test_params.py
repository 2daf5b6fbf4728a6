"""Shovel definitions (cluster/shovel/params.py): RabbitMQ's keys, defaults and refusals of invalid combinations."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.link.uri import UriError, parse_uri
from cluster.shovel.params import ShovelParamError, parse_definition

SRC = "amqp://guest:guest@127.0.0.1:5672/%2F"
DEST = "amqp://u:p@h2:5673/v1"


def _value(**extra: Any) -> dict[str, Any]:
    return {"src-uri": SRC, "src-queue": "a", "dest-uri": DEST, **extra}


def test_defaults_are_rabbitmqs() -> None:
    d = parse_definition("/", "s1", _value())
    assert d.src_uris == (SRC,) and d.dest_uris == (DEST,)
    assert (d.src_prefetch_count, d.src_delete_after, d.ack_mode, d.reconnect_delay_ms) == (1000, "never",
                                                                                             "on-confirm", 1000)
    assert d.dest_queue is None and d.dest_exchange is None and not d.add_forward_headers
    assert d.src_uri(0).vhost == "/" and d.dest_uri(0).vhost == "v1" and d.dest_uri(0).port == 5673


def test_uri_lists_legacy_keys_and_numbers() -> None:
    d = parse_definition("/", "s", {"src-uri": [SRC, "amqp://h3"], "src-exchange": "x", "src-exchange-key": "k",
                                    "dest-uri": DEST, "dest-exchange": "y", "prefetch-count": 5,
                                    "delete-after": 10, "add-forward-headers": True, "reconnect-delay": 2.5})
    assert d.src_uris == (SRC, "amqp://h3") and d.src_uri(1).host == "h3" and d.src_uri(2).host == "127.0.0.1"
    assert (d.src_exchange, d.src_exchange_key, d.dest_exchange, d.dest_exchange_key) == ("x", "k", "y", None)
    assert (d.src_prefetch_count, d.src_delete_after, d.add_forward_headers) == (5, 10, True)
    assert d.reconnect_delay_ms == 2500


@pytest.mark.parametrize(("value", "reason"), [
    ({"src-uri": SRC, "dest-uri": DEST}, "Must specify 'src-exchange' or 'src-queue'"),
    (_value(**{"src-exchange": "x"}), "Cannot specify 'src-exchange' and 'src-queue'"),
    (_value(**{"dest-queue": "q", "dest-exchange": "x"}), "Cannot specify 'dest-exchange' and 'dest-queue'"),
    (_value(**{"ack-mode": "no-ack", "src-delete-after": 5}), "Cannot specify 'no-ack' and numerical 'delete-after'"),
    (_value(**{"ack-mode": "sometimes"}), "ack-mode should be one of"),
    ({"src-queue": "a", "dest-uri": DEST}, 'Key "src-uri" not found'),
    (_value(**{"dest-uri": []}), "non-empty list"),
    (_value(**{"dest-uri": "http://x"}), "scheme must be amqp"),
    (_value(**{"src-uri": "amqps://h?verify=sometimes"}), "verify must be verify_peer or verify_none"),
    (_value(**{"src-uri": "amqp://h?cacertfile=/ca.pem"}), "TLS options need an amqps URI"),
    (_value(**{"src-prefetch-count": -1}), "src-prefetch-count"),
    (_value(**{"src-delete-after": "sometime"}), "src-delete-after"),
    (_value(**{"reconnect-delay": "soon"}), "reconnect-delay"),
    (_value(**{"colour": "blue"}), "Unrecognised terms ['colour']"),
    (_value(**{"dest-protocol": "amqp10"}), "not supported"),
    (_value(**{"dest-publish-properties": {"headers": {}}}), "cannot set headers"),
    ({"src-uri": SRC, "src-exchange": "x", "dest-uri": DEST, "src-delete-after": "queue-length"}, "queue-length"),
])
def test_invalid_definitions_are_refused(value: dict[str, Any], reason: str) -> None:
    with pytest.raises(ShovelParamError) as refused:
        parse_definition("/", "s", value)
    assert reason in str(refused.value)


def test_uri_parsing() -> None:
    u = parse_uri("amqp://us%40r:p%3Aw@example:1234/my%2Fvhost?heartbeat=5&connection_timeout=2000")
    assert (u.username, u.password, u.host, u.port, u.vhost) == ("us@r", "p:w", "example", 1234, "my/vhost")
    assert (u.heartbeat_s, u.connection_timeout_ms, u.local) == (5, 2000, False)
    assert parse_uri("amqp://h").vhost == "/" and parse_uri("amqp://h/").vhost == ""
    assert parse_uri("amqp://").local and "p:w" not in u.redacted()
    with pytest.raises(UriError):
        parse_uri("amqp://h/a/b")


def test_amqps_uris_take_rabbitmqs_tls_keys() -> None:
    u = parse_uri("amqps://u:p@broker.example/v?cacertfile=/tls/ca.pem&certfile=/tls/c.pem&keyfile=/tls/c.key"
                  "&verify=verify_peer&server_name_indication=other.example&fail_if_no_peer_cert=true")
    assert (u.tls, u.port, u.cacertfile, u.certfile, u.keyfile) == (True, 5671, "/tls/ca.pem", "/tls/c.pem",
                                                                    "/tls/c.key")
    assert (u.verify, u.tls_server_name) == ("verify_peer", "other.example")
    assert u.redacted() == "amqps://u@broker.example:5671/v"
    plain = parse_uri("amqps://h:1234")
    assert (plain.port, plain.verify, plain.tls_server_name) == (1234, "verify_peer", "h")  # checked by default
    assert parse_uri("amqps://h?server_name_indication=disable").tls_server_name is None
    assert parse_uri("amqps://h?verify=verify_none").verify == "verify_none"
    for bad in ("amqps://", "amqps://h?keyfile=/k.pem", "amqp://h?verify=verify_none"):
        with pytest.raises(UriError):
            parse_uri(bad)
