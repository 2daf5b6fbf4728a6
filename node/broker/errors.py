"""AMQP errors raised inside the broker model and turned into channel or connection closes.

Texts follow RabbitMQ's ("NOT_FOUND - no queue 'q' in vhost '/'"): the symbolic name of the reply code, " - ",
then the detail. `connection=True` marks the hard errors RabbitMQ answers with connection.close.
"""

from __future__ import annotations

_NAMES = {
    311: "CONTENT_TOO_LARGE", 312: "NO_ROUTE", 313: "NO_CONSUMERS", 320: "CONNECTION_FORCED",
    402: "INVALID_PATH", 403: "ACCESS_REFUSED", 404: "NOT_FOUND", 405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED", 501: "FRAME_ERROR", 502: "SYNTAX_ERROR", 503: "COMMAND_INVALID",
    504: "CHANNEL_ERROR", 505: "UNEXPECTED_FRAME", 506: "RESOURCE_ERROR", 530: "NOT_ALLOWED",
    540: "NOT_IMPLEMENTED", 541: "INTERNAL_ERROR",
}

ACCESS_REFUSED = 403
NOT_FOUND = 404
PRECONDITION_FAILED = 406
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540
INTERNAL_ERROR = 541


class AmqpError(Exception):
    def __init__(self, reply_code: int, detail: str, connection: bool = False) -> None:
        self.reply_code = reply_code
        self.reply_text = f"{_NAMES.get(reply_code, 'ERROR')} - {detail}"
        self.connection = connection
        super().__init__(self.reply_text)


def not_found(kind: str, name: str, vhost: str) -> AmqpError:
    return AmqpError(NOT_FOUND, f"no {kind} '{name}' in vhost '{vhost}'")


def precondition(detail: str) -> AmqpError:
    return AmqpError(PRECONDITION_FAILED, detail)


def access_refused(detail: str) -> AmqpError:
    return AmqpError(ACCESS_REFUSED, detail)


class MetadataUnconfirmed(Exception):
    """Replicated mode: the method's answer would be an error that this node's copy of the definitions may be
    behind on: an exclusive queue owned by another node's connection (which may be gone already: its deletion
    committed, not yet applied here), or a queue this node does not know (which may have just been declared on
    another node). The broker defers the channel behind a metadata read barrier and runs the method again then
    (node/broker/broker.py, "the owner barrier")."""
