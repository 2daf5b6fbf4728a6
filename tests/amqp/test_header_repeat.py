"""ChannelAssembly remembers the last content header without a headers table: a repeat of the same bytes gives the
same properties and body size without a decode, and every check still holds."""

from __future__ import annotations

from typing import Any

import pytest

from node.amqp import channel as channel_module
from node.amqp.channel import ChannelAssembly
from node.amqp.errors import ChannelProtocolError
from node.amqp.methods import BasicPublish
from node.amqp.properties import BasicProperties, encode_content_header
from node.amqp.spec import FRAME_BODY, FRAME_HEADER


def _publish(ch: ChannelAssembly, header: bytes, body: bytes, max_message_size: int = 1000) -> Any:
    ch.publish = BasicPublish(routing_key="q")
    content = ch.content_frame(FRAME_HEADER, header, max_message_size)
    if content is None:
        content = ch.content_frame(FRAME_BODY, body, max_message_size)
    return content


def test_repeated_header_is_not_decoded_again(monkeypatch: Any) -> None:
    ch = ChannelAssembly()
    header = encode_content_header(3, BasicProperties(delivery_mode=2, content_type="text/plain"))
    first = _publish(ch, header, b"abc")
    decodes = 0
    real = channel_module.decode_content_header

    def counting(payload: bytes) -> Any:
        nonlocal decodes
        decodes += 1
        return real(payload)

    monkeypatch.setattr(channel_module, "decode_content_header", counting)
    second = _publish(ch, bytes(header), b"xyz")
    assert decodes == 0
    assert second[1] is first[1] and second[2] == b"xyz"
    other = encode_content_header(3, BasicProperties(delivery_mode=1))
    third = _publish(ch, other, b"def")
    assert decodes == 1 and third[1] == BasicProperties(delivery_mode=1)


def test_header_with_a_headers_table_is_decoded_every_time() -> None:
    ch = ChannelAssembly()
    header = encode_content_header(1, BasicProperties(headers={"a": 1}))
    first = _publish(ch, header, b"x")
    second = _publish(ch, header, b"y")
    assert first[1] == second[1] and first[1] is not second[1]
    assert ch.last_header_content is None


def test_size_limit_still_applies_to_a_repeated_header() -> None:
    ch = ChannelAssembly()
    header = encode_content_header(500, BasicProperties(delivery_mode=2))
    assert _publish(ch, header, b"z" * 500)[2] == b"z" * 500
    ch.publish = BasicPublish(routing_key="q")
    with pytest.raises(ChannelProtocolError):
        ch.content_frame(FRAME_HEADER, header, 100)


def test_empty_body_completes_at_the_header() -> None:
    ch = ChannelAssembly()
    header = encode_content_header(0, BasicProperties(delivery_mode=2))
    assert _publish(ch, header, b"")[2] == b""
    ch.publish = BasicPublish(routing_key="q")
    assert ch.content_frame(FRAME_HEADER, header, 1000) is not None
