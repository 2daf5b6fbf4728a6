"""Protocol errors raised inside node.amqp and RabbitMQ-style reply texts.

`ProtocolError` closes the connection, `ChannelProtocolError` only the channel; both carry the reply code, the
formatted reply text ("NOT_FOUND - ...", valid UTF-8, at most 255 bytes) and the offending class/method ids.
"""

from __future__ import annotations

import re

from node.amqp.methods import Method
from node.amqp.spec import ReplyCode


class ProtocolError(Exception):
    def __init__(self, code: ReplyCode, explanation: str, class_id: int = 0, method_id: int = 0) -> None:
        super().__init__(explanation)
        self.code = code
        self.text = reply_text(code, explanation)
        self.class_id = class_id
        self.method_id = method_id


class ChannelProtocolError(ProtocolError):
    pass


def reply_text(code: ReplyCode, explanation: str) -> str:
    """RabbitMQ's reply-text form, e.g. "NOT_FOUND - no queue 'q' in vhost '/'" (max 255 bytes)."""
    return safe_text(f"{code.name} - {explanation}")


def safe_text(text: str) -> str:
    """Valid UTF-8 of at most 255 bytes: names we echo may hold undecodable bytes (kept as surrogates)."""
    raw = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace").encode("utf-8")
    return raw[:255].decode("utf-8", "ignore")


def amqp_method_name(cls: type[Method]) -> str:
    """RabbitMQ's name for a method: Basic.GetOk -> 'basic.get_ok'."""
    klass, method = cls.NAME.split(".")
    snake = re.sub(r"(?<!^)([A-Z])", r"_\1", method).lower()
    return f"{klass.lower()}.{snake}"


def check_negotiated(name: str, minimum: int, server_value: int, client_value: int) -> None:
    """RabbitMQ's validate_negotiated_integer_value: 530 NOT_ALLOWED when out of range."""
    if client_value != 0 and client_value < minimum:
        raise ProtocolError(
            ReplyCode.NOT_ALLOWED,
            f"negotiated {name} = {client_value} is lower than the minimum allowed value ({minimum})",
            10,
            30,
        )
    if server_value != 0 and (client_value == 0 or client_value > server_value):
        raise ProtocolError(
            ReplyCode.NOT_ALLOWED,
            f"negotiated {name} = {client_value} is higher than the maximum allowed value ({server_value})",
            10,
            30,
        )
