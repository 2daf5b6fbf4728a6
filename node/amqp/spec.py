"""AMQP 0-9-1 constants: frame types, the protocol header, reply codes and class ids.

Values follow the 0-9-1 specification and RabbitMQ's `rabbit_framing_amqp_0_9_1`. Nothing here does work; every
other module in `node.amqp` imports its numbers from this one.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

FRAME_METHOD: Final = 1
FRAME_HEADER: Final = 2
FRAME_BODY: Final = 3
FRAME_HEARTBEAT: Final = 8
FRAME_END: Final = 0xCE
FRAME_END_BYTE: Final = b"\xce"
FRAME_HEADER_SIZE: Final = 7
FRAME_OVERHEAD: Final = 8  # 7-byte header + frame-end octet
FRAME_MIN_SIZE: Final = 4096  # the spec's frame-min-size; frame_max is never negotiated below it

PROTOCOL_HEADER: Final = b"AMQP\x00\x00\x09\x01"
VERSION_MAJOR: Final = 0
VERSION_MINOR: Final = 9

HEARTBEAT_FRAME: Final = b"\x08\x00\x00\x00\x00\x00\x00\xce"

CLASS_CONNECTION: Final = 10
CLASS_CHANNEL: Final = 20
CLASS_ACCESS: Final = 30
CLASS_EXCHANGE: Final = 40
CLASS_QUEUE: Final = 50
CLASS_BASIC: Final = 60
CLASS_CONFIRM: Final = 85
CLASS_TX: Final = 90


class ReplyCode(IntEnum):
    """Reply codes used in Connection.Close / Channel.Close / Basic.Return (RabbitMQ's set)."""

    REPLY_SUCCESS = 200
    CONTENT_TOO_LARGE = 311
    NO_ROUTE = 312
    NO_CONSUMERS = 313
    CONNECTION_FORCED = 320
    INVALID_PATH = 402
    ACCESS_REFUSED = 403
    NOT_FOUND = 404
    RESOURCE_LOCKED = 405
    PRECONDITION_FAILED = 406
    FRAME_ERROR = 501
    SYNTAX_ERROR = 502
    COMMAND_INVALID = 503
    CHANNEL_ERROR = 504
    UNEXPECTED_FRAME = 505
    RESOURCE_ERROR = 506
    NOT_ALLOWED = 530
    NOT_IMPLEMENTED = 540
    INTERNAL_ERROR = 541


# Codes that are "hard errors" (close the connection) in the spec's sense.
CONNECTION_ERROR_CODES: Final = frozenset(
    {
        ReplyCode.CONNECTION_FORCED,
        ReplyCode.INVALID_PATH,
        ReplyCode.FRAME_ERROR,
        ReplyCode.SYNTAX_ERROR,
        ReplyCode.COMMAND_INVALID,
        ReplyCode.CHANNEL_ERROR,
        ReplyCode.UNEXPECTED_FRAME,
        ReplyCode.RESOURCE_ERROR,
        ReplyCode.NOT_ALLOWED,
        ReplyCode.NOT_IMPLEMENTED,
        ReplyCode.INTERNAL_ERROR,
    }
)
