"""The bounded HTTP/1.1 request checks (on h11) and the pure parts of the API (no sockets)."""

from __future__ import annotations

import datetime
import decimal

import h11
import pytest

from node.runtime import management_http as http
from node.runtime.management_api import (
    CommandError,
    check_command_args,
    jsonable,
    parse_basic_auth,
    required_tag,
)


def test_head_is_bounded() -> None:
    head = http.parse_request(b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"x" * 1000 + b"\r\n\r\n")
    assert head.headers["x-pad"] == "x" * 1000
    with pytest.raises(http.HttpError) as err:
        http.parse_request(b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"x" * (http.HEAD_BYTES_MAX + 1))
    assert err.value.status == 431


def test_request_line_path_segments_and_headers() -> None:
    head = http.parse_request(b"GET /api/queues/%2F/my%20q?columns=name HTTP/1.1\r\nHost: x\r\n"
                              b"Content-Length: 0\r\n\r\n")
    assert head.segments == ("api", "queues", "/", "my q")
    assert head.query == {"columns": ["name"]} and head.headers["host"] == "x" and head.keep_alive
    old = http.parse_request(b"GET / HTTP/1.0\r\n\r\n")
    assert not old.keep_alive
    assert http.parse_request(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").keep_alive
    assert not http.parse_request(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").keep_alive


@pytest.mark.parametrize(("raw", "status"), [
    (b"GET /\r\n\r\n", 400),
    (b"BREW / HTTP/1.1\r\nHost: x\r\n\r\n", 405),
    (b"GET / HTTP/3\r\n\r\n", 505),
    (b"GET / HTTP/2.0\r\n\r\n", 505),
    (b"GET relative HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: x\r\nno-colon\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\n bad: x\r\n\r\n", 400),
    (b"PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400),
    (b"PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n", 400),
    (b"PUT / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
    (b"PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (http.BODY_BYTES_MAX + 1), 413),
    (b"GET /%ff HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"h%d: v\r\n" % i for i in range(101)) + b"\r\n", 431),
])
def test_malformed_requests_name_their_status(raw: bytes, status: int) -> None:
    with pytest.raises(http.HttpError) as err:
        http.parse_request(raw)
    assert err.value.status == status


def test_responses_always_carry_their_length() -> None:
    server = http.new_connection()
    server.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    server.next_event()
    server.next_event()
    raw = b"".join(server.send(e) or b"" for e in http.response_events(200, {"a": 1}, keep_alive=False,
                                                                       extra_headers=(("X-Y", "z"),)))
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"content-length: 7" in head and b"connection: close" in head
    assert b"X-Y: z" in head and body == b'{"a":1}'  # (compact, as RabbitMQ's)
    no_content = http.response_events(204, {"ignored": True})
    assert [type(e) for e in no_content] == [h11.Response, h11.EndOfMessage]
    head_only = http.response_events(200, [1], head_only=True)
    assert [type(e) for e in head_only] == [h11.Response, h11.EndOfMessage]
    assert (b"content-length", b"3") in head_only[0].headers
    assert http.parse_json_body(b"") == {} and http.parse_json_body(b'{"x": [1]}') == {"x": [1]}


def test_basic_auth_and_json_conversion() -> None:
    assert parse_basic_auth("Basic Z3Vlc3Q6Z3U6ZXN0") == ("guest", "gu:est")  # a colon in the password
    assert parse_basic_auth("Bearer abc") is None and parse_basic_auth("Basic !!!") is None
    assert parse_basic_auth("Basic Z3Vlc3Q=") is None  # no colon
    value = {"b": b"txt", "d": decimal.Decimal("1.5"), "t": datetime.datetime(2024, 1, 2, tzinfo=datetime.UTC),
             "x": bytearray(b"\x01\xff"), "l": (1, [None, True])}
    assert jsonable(value) == {"b": "txt", "d": 1.5, "t": "2024-01-02T00:00:00+00:00", "x": "01ff",
                               "l": [1, [None, True]]}


def test_command_arguments_are_checked_before_a_view_sees_them() -> None:
    assert check_command_args("add_member", {"vhost": "/", "queue": "q", "node": "n", "extra": 1}) == {
        "vhost": "/", "queue": "q", "node": "n"}
    for name, args, fragment in (("add_member", {"vhost": "/", "queue": "q"}, "missing argument 'node'"),
                                 ("set_policy", {"vhost": "/", "name": "p", "pattern": ".*", "definition": {},
                                                 "priority": True}, "'priority' must be an integer"),
                                 ("add_user", {"name": "u", "password": "p", "tags": ["a", 1]}, "tags"),
                                 ("rebalance", [], "JSON object")):
        with pytest.raises(CommandError) as err:
            check_command_args(name, args)
        assert err.value.status == 400 and fragment in err.value.reason
    with pytest.raises(CommandError) as err:
        check_command_args("nope", {})
    assert err.value.status == 404


def test_binding_properties_keys_are_rabbitmqs() -> None:
    # RabbitMQ 3.10 answers these for bindings without arguments (checked against it, test_rabbitmq_compare.py).
    assert http.properties_key("", {}) == "~"
    assert http.properties_key("a.*", {}) == "a.%2A"
    assert http.properties_key("a b~c", {}) == "a+b%7Ec"
    with_args = http.properties_key("k", {"x-match": "all"})
    assert with_args.startswith("k~") and with_args != http.properties_key("k", {"x-match": "any"})


@pytest.mark.parametrize(("method", "path", "tag"), [
    ("GET", "/api/overview", "management"), ("GET", "/api/queues/%2F", "management"),
    ("PUT", "/api/queues/%2F/q", "management"), ("GET", "/api/vhosts", "management"),
    ("PUT", "/api/vhosts/v", "administrator"), ("GET", "/api/users", "administrator"),
    ("GET", "/api/definitions", "administrator"), ("POST", "/api/raftmq/grow", "administrator"),
    ("GET", "/api/nodes", "monitoring"), ("GET", "/api/vhost-limits", "monitoring"),
    ("PUT", "/api/vhost-limits/%2F/max-queues", "administrator"), ("GET", "/api/policies", "policymaker"),
    ("PUT", "/api/parameters/shovel/%2F/s", "policymaker"),
])
def test_each_path_needs_rabbitmqs_tag(method: str, path: str, tag: str) -> None:
    assert required_tag(method, http.split_path(path)) == tag
