"""Wire form of replicated queue proposals: group ids, `Proposal` (origin, id, command) and its cbor codec.

A proposal is the body of one entry of a queue's Raft log: `Proposal(origin, proposal_id, command)`. It is encoded
as one cbor array `[origin, proposal_id, kind, *fields]`, origin and id first so `peek_proposal` can read them from
the first few bytes without decoding the command (`envelope.EnvelopeCodec` does, to find its own entries). A log
entry is an `envelope.Envelope`: this proposal behind the queue's incarnation; only `envelope` calls this module
for the node.

The fields (ids, ints, msg-id lists, queue arguments, messages) are encoded and checked by proposal_fields.py;
its `ProposalDecodeError`, `encode_id`/`decode_id` and payload codec types are re-exported here. Consumer and
publisher ids are opaque hashables; the broker's are the typed ids of `cluster.queue.ids`, which `encode_id`
writes as their wire arrays and `decode_id` reads back (the same arrays as the tuples they replaced); any other
tuple of str/int is written as a list and comes back as a tuple. Message payloads are opaque to this module:
the caller passes `encode_payload(payload) -> cbor-able value` and
`decode_payload(value) -> payload`.

`EnqueueMany` is how a run of one channel's publishes travels as one entry. Its usual layout is kind "enqb":
publisher id and now_ms once, the sequences (just the first one when they are consecutive), the [persistent,
priority, ttl_ms] every message shares, the sizes as one byte string (4 bytes little-endian each) and the list of
payloads, so decoding builds each message without walking or checking its fields one by one. A batch whose
messages differ in those fields (or a size of 4 GiB or more) goes as kind "enqm", each message a [payload,
size_bytes, persistent, priority, ttl_ms] row. "enqm" and single `Enqueue` entries ("enq") stay valid, so logs
written before "enqb" decode; a node that predates "enqb" cannot read it (no mixed-version clusters).
Group ids live in `cluster.queue.group_ids` (re-exported here).

Decoding treats the bytes as untrusted: any malformed input (bad cbor, wrong shape, wrong field types, or an
exception from `decode_payload`) raises `ProposalDecodeError` (a ValueError) and nothing else. msg_id lists come
back as tuples. `SetArgs` carries the ten `QueueArgs` fields in declaration order, each checked (ints >= 0 or None,
overflow and strategy among their values, strs or None, max_priority 0..255 or None, a bool), then auto_delete
and expires_ms only when one is set (so entries written before those fields, and new ones without them, are the
same bytes); a `SetArgs` with a now_ms is kind "argt" [args, now_ms], without one (0) "args" as before. `Cancel` is
kind "cancel", `Declare` kind "decl".
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import cbor2

from cluster.queue.group_ids import GROUP_PREFIX as GROUP_PREFIX
from cluster.queue.group_ids import INCARNATION_LIMIT as INCARNATION_LIMIT
from cluster.queue.group_ids import INCARNATION_SEPARATOR as INCARNATION_SEPARATOR
from cluster.queue.group_ids import parse_queue_group_id as parse_queue_group_id
from cluster.queue.group_ids import queue_group_id as queue_group_id
from cluster.queue.proposal_fields import ID_DEPTH_MAX as ID_DEPTH_MAX
from cluster.queue.proposal_fields import INT_MAX as INT_MAX
from cluster.queue.proposal_fields import INT_MIN as INT_MIN
from cluster.queue.proposal_fields import PRIORITY_MAX as PRIORITY_MAX
from cluster.queue.proposal_fields import DecodePayload as DecodePayload
from cluster.queue.proposal_fields import EncodePayload as EncodePayload
from cluster.queue.proposal_fields import ProposalDecodeError as ProposalDecodeError
from cluster.queue.proposal_fields import (
    check_message,
    decode_args,
    decode_message,
    encode_args,
    encode_message,
    field_bool,
    field_int,
    field_msg_ids,
    field_opt_int,
    fields_of,
)
from cluster.queue.proposal_fields import decode_id as decode_id
from cluster.queue.proposal_fields import encode_id as encode_id
from cluster.queue.seal import Seal
from cluster.queue.types import (
    AddCredit,
    Attach,
    Cancel,
    Declare,
    Detach,
    Discard,
    Enqueue,
    EnqueueMany,
    Expire,
    Get,
    MsgId,
    Purge,
    QueueCommand,
    QueuedMessage,
    Recover,
    Return,
    SetArgs,
    Settle,
    SettleDeadLettered,
)

PROPOSAL_ID_MAX: Final = 2**64 - 1
ENQUEUE_MANY_MAX: Final = 4096  # messages in one EnqueueMany (the broker batches far fewer)
SIZE_FLAT_MAX: Final = 2**32 - 1  # message sizes an "enqb" row carries (4 bytes each)


# --- the envelope ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Proposal:
    """One command proposed to a queue's group by `origin` (a node), numbered `proposal_id` by that origin."""

    origin: str
    proposal_id: int
    command: QueueCommand | Seal


# --- commands -------------------------------------------------------------------------------------------------


def _encode_command(command: QueueCommand | Seal, encode_payload: EncodePayload) -> list[Any]:
    match command:
        case Enqueue(message, now_ms, publisher_id, sequence):
            return [
                "enq",
                encode_message(message, encode_payload),
                now_ms,
                encode_id(publisher_id),
                sequence,
            ]
        case EnqueueMany(publisher_id, now_ms, messages, sequences):
            flat = _encode_enqueue_flat(publisher_id, now_ms, messages, sequences, encode_payload)
            if flat is not None:
                return flat
            return [
                "enqm",
                encode_id(publisher_id),
                now_ms,
                _encode_sequences(sequences),
                [encode_message(message, encode_payload) for message in messages],
            ]
        case Attach(consumer_id, now_ms, prefetch, credit, priority, no_ack):
            return ["att", encode_id(consumer_id), now_ms, prefetch, credit, priority, no_ack]
        case Detach(consumer_id, now_ms):
            return ["det", encode_id(consumer_id), now_ms]
        case AddCredit(consumer_id, credit):
            return ["cred", encode_id(consumer_id), credit]
        case Settle(consumer_id, msg_ids):
            return ["settle", encode_id(consumer_id), list(msg_ids)]
        case Return(consumer_id, msg_ids, now_ms):
            return ["ret", encode_id(consumer_id), list(msg_ids), now_ms]
        case Discard(consumer_id, msg_ids, now_ms):
            return ["disc", encode_id(consumer_id), list(msg_ids), now_ms]
        case Get(consumer_id, no_ack, now_ms):
            return ["get", encode_id(consumer_id), no_ack, now_ms]
        case Expire(now_ms):
            return ["exp", now_ms]
        case Purge(transient_only):
            return ["purge", True] if transient_only else ["purge"]
        case Recover(msg_id, message, delivery_count, expiry_ms):
            return ["rec", msg_id, encode_message(message, encode_payload), delivery_count, expiry_ms]
        case SetArgs(args, now_ms):
            return ["argt", encode_args(args), now_ms] if now_ms else ["args", encode_args(args)]
        case SettleDeadLettered(msg_ids):
            return ["dlsettle", list(msg_ids)]
        case Seal():
            return ["seal"]
        case Cancel(consumer_id, now_ms):
            return ["cancel", encode_id(consumer_id), now_ms]
        case Declare(now_ms):
            return ["decl", now_ms]
    raise TypeError(f"not a queue command: {command!r}")


def _decode_enqueue(f: list[Any], dp: DecodePayload) -> QueueCommand:
    message, now_ms, publisher_id, sequence = fields_of(f, 4)
    return Enqueue(decode_message(message, dp), field_int(now_ms), decode_id(publisher_id), field_opt_int(sequence))


def _encode_sequences(sequences: Sequence[int]) -> int | list[int]:
    """A consecutive run (the usual case: one channel's publishes to one queue) as its first sequence."""
    first = sequences[0]
    if sequences[-1] - first == len(sequences) - 1 and all(
        sequence == first + offset for offset, sequence in enumerate(sequences)
    ):
        return first
    return list(sequences)


def _decode_sequences(value: Any, count: int) -> tuple[int, ...]:
    if type(value) is int:
        first = field_int(value)
        field_int(first + count - 1)
        return tuple(range(first, first + count))
    if type(value) is not list or len(value) != count:
        raise ProposalDecodeError("expected a sequence per message")
    return tuple([field_int(sequence) for sequence in value])


def _decode_enqueue_many(f: list[Any], dp: DecodePayload) -> QueueCommand:
    publisher_id, now_ms, sequences, messages = fields_of(f, 4)
    if type(messages) is not list or not 1 <= len(messages) <= ENQUEUE_MANY_MAX:
        raise ProposalDecodeError(f"expected 1..{ENQUEUE_MANY_MAX} messages")
    return EnqueueMany(
        decode_id(publisher_id),
        field_int(now_ms),
        tuple([decode_message(message, dp) for message in messages]),
        _decode_sequences(sequences, len(messages)),
    )


def _encode_enqueue_flat(publisher_id: Hashable, now_ms: int, messages: Sequence[QueuedMessage],
                         sequences: Sequence[int], encode_payload: EncodePayload) -> list[Any] | None:
    """The "enqb" row of a batch whose messages share persistent/priority/ttl_ms (None: not that case, or a size
    that is no int below 2**32: the batch goes as "enqm", whose checks name what is wrong)."""
    first = messages[0]
    persistent, priority, ttl_ms = first.persistent, first.priority, first.ttl_ms
    for message in messages:
        if message.persistent is not persistent or message.priority != priority or message.ttl_ms != ttl_ms:
            return None
    sizes = [message.size_bytes for message in messages]
    if set(map(type, sizes)) != {int} or min(sizes) < 0 or max(sizes) > SIZE_FLAT_MAX:
        return None
    return [
        "enqb",
        encode_id(publisher_id),
        now_ms,
        _encode_sequences(sequences),
        [persistent, priority, ttl_ms],
        struct.pack(f"<{len(sizes)}I", *sizes),
        [encode_payload(message.payload) for message in messages],
    ]


def _flat_common(value: Any) -> tuple[bool, int, int | None]:
    """The [persistent, priority, ttl_ms] every message of an "enqb" batch shares, checked."""
    if type(value) is not list or len(value) != 3:
        raise ProposalDecodeError("expected [persistent, priority, ttl_ms]")
    persistent, priority, ttl_ms = value
    return field_bool(persistent), field_int(priority, 0, PRIORITY_MAX), field_opt_int(ttl_ms)


def _flat_sizes(value: Any, count: int) -> tuple[int, ...]:
    if type(value) is not bytes or len(value) != 4 * count:
        raise ProposalDecodeError("expected a 4-byte size per message")
    return struct.unpack(f"<{count}I", value)


def _flat_count(payloads: Any) -> int:
    if type(payloads) is not list or not 1 <= len(payloads) <= ENQUEUE_MANY_MAX:
        raise ProposalDecodeError(f"expected 1..{ENQUEUE_MANY_MAX} messages")
    return len(payloads)


def _decode_enqueue_flat(f: list[Any], dp: DecodePayload) -> QueueCommand:
    publisher_id, now_ms, sequences, common, sizes, payloads = fields_of(f, 6)
    count = _flat_count(payloads)
    persistent, priority, ttl_ms = _flat_common(common)
    size_values = _flat_sizes(sizes, count)
    try:
        messages = tuple([QueuedMessage(dp(payload), size_bytes, persistent, priority, ttl_ms)
                          for payload, size_bytes in zip(payloads, size_values, strict=True)])
    except Exception as exc:  # the payload codec is the caller's; its failures are decode errors too
        raise ProposalDecodeError(f"bad payload: {exc}") from exc
    return EnqueueMany(decode_id(publisher_id), field_int(now_ms), messages, _decode_sequences(sequences, count))


def _decode_attach(f: list[Any], dp: DecodePayload) -> QueueCommand:
    consumer_id, now_ms, prefetch, credit, priority, no_ack = fields_of(f, 6)
    return Attach(
        decode_id(consumer_id),
        field_int(now_ms),
        field_int(prefetch),
        field_opt_int(credit),
        field_int(priority, INT_MIN),
        field_bool(no_ack),
    )


def _decode_detach(f: list[Any], dp: DecodePayload) -> QueueCommand:
    consumer_id, now_ms = fields_of(f, 2)
    return Detach(decode_id(consumer_id), field_int(now_ms))


def _decode_add_credit(f: list[Any], dp: DecodePayload) -> QueueCommand:
    consumer_id, credit = fields_of(f, 2)
    return AddCredit(decode_id(consumer_id), field_int(credit))


def _decode_settle(f: list[Any], dp: DecodePayload) -> QueueCommand:
    consumer_id, msg_ids = fields_of(f, 2)
    return Settle(decode_id(consumer_id), field_msg_ids(msg_ids))


def _decode_return(f: list[Any], dp: DecodePayload) -> QueueCommand:
    consumer_id, msg_ids, now_ms = fields_of(f, 3)
    return Return(decode_id(consumer_id), field_msg_ids(msg_ids), field_int(now_ms))


def _decode_discard(f: list[Any], dp: DecodePayload) -> QueueCommand:
    consumer_id, msg_ids, now_ms = fields_of(f, 3)
    return Discard(decode_id(consumer_id), field_msg_ids(msg_ids), field_int(now_ms))


def _decode_get(f: list[Any], dp: DecodePayload) -> QueueCommand:
    consumer_id, no_ack, now_ms = fields_of(f, 3)
    return Get(decode_id(consumer_id), field_bool(no_ack), field_int(now_ms))


def _decode_expire(f: list[Any], dp: DecodePayload) -> QueueCommand:
    (now_ms,) = fields_of(f, 1)
    return Expire(field_int(now_ms))


def _decode_purge(f: list[Any], dp: DecodePayload) -> QueueCommand:
    if len(f) == 1:
        return Purge(transient_only=field_bool(f[0]))
    fields_of(f, 0)
    return Purge()


def _decode_recover(f: list[Any], dp: DecodePayload) -> QueueCommand:
    msg_id, message, delivery_count, expiry_ms = fields_of(f, 4)
    return Recover(
        MsgId(field_int(msg_id, 1)), decode_message(message, dp), field_int(delivery_count), field_opt_int(expiry_ms)
    )


def _decode_set_args(f: list[Any], dp: DecodePayload) -> QueueCommand:
    (args,) = fields_of(f, 1)
    return SetArgs(decode_args(args))


def _decode_set_args_at(f: list[Any], dp: DecodePayload) -> QueueCommand:
    args, now_ms = fields_of(f, 2)
    return SetArgs(decode_args(args), field_int(now_ms))


def _decode_cancel(f: list[Any], dp: DecodePayload) -> QueueCommand:
    consumer_id, now_ms = fields_of(f, 2)
    return Cancel(decode_id(consumer_id), field_int(now_ms))


def _decode_declare(f: list[Any], dp: DecodePayload) -> QueueCommand:
    (now_ms,) = fields_of(f, 1)
    return Declare(field_int(now_ms))


def _decode_settle_dead_lettered(f: list[Any], dp: DecodePayload) -> QueueCommand:
    (msg_ids,) = fields_of(f, 1)
    return SettleDeadLettered(field_msg_ids(msg_ids))


def _decode_seal(f: list[Any], dp: DecodePayload) -> Seal:
    fields_of(f, 0)
    return Seal()


_DECODERS: Final[dict[str, Callable[[list[Any], DecodePayload], QueueCommand | Seal]]] = {
    "enq": _decode_enqueue,
    "enqm": _decode_enqueue_many,
    "enqb": _decode_enqueue_flat,
    "att": _decode_attach,
    "det": _decode_detach,
    "cred": _decode_add_credit,
    "settle": _decode_settle,
    "ret": _decode_return,
    "disc": _decode_discard,
    "get": _decode_get,
    "exp": _decode_expire,
    "purge": _decode_purge,
    "rec": _decode_recover,
    "args": _decode_set_args,
    "argt": _decode_set_args_at,
    "dlsettle": _decode_settle_dead_lettered,
    "seal": _decode_seal,
    "cancel": _decode_cancel,
    "decl": _decode_declare,
}


# --- proposals ------------------------------------------------------------------------------------------------


def _check_header(origin: Any, proposal_id: Any) -> tuple[str, int]:
    if not isinstance(origin, str) or not origin:
        raise ProposalDecodeError("origin must be a non-empty str")
    if type(proposal_id) is not int or not 0 <= proposal_id <= PROPOSAL_ID_MAX:
        raise ProposalDecodeError(f"proposal id out of range: {proposal_id!r:.80}")
    return origin, proposal_id


def _keep_payload(value: Any) -> Any:
    return value


def _check_enqueue(row: list[Any]) -> None:
    """What `_decode_enqueue` checks of an encoded ["enq", message, now_ms, publisher_id, sequence] row."""
    _, message, now_ms, publisher_id, sequence = row
    check_message(message)
    field_int(now_ms)
    decode_id(publisher_id)
    field_opt_int(sequence)


def _check_enqueue_many(row: list[Any]) -> None:
    """What `_decode_enqueue_many` checks of an encoded ["enqm", publisher_id, now_ms, sequences, messages] row."""
    _, publisher_id, now_ms, sequences, messages = row
    decode_id(publisher_id)
    field_int(now_ms)
    if not 1 <= len(messages) <= ENQUEUE_MANY_MAX:
        raise ProposalDecodeError(f"expected 1..{ENQUEUE_MANY_MAX} messages")
    _decode_sequences(sequences, len(messages))
    for message in messages:
        check_message(message)


def _check_enqueue_flat(row: list[Any]) -> None:
    """What `_decode_enqueue_flat` checks of an encoded "enqb" row, but the payloads (the sizes were checked when
    the row was built)."""
    _, publisher_id, now_ms, sequences, common, _sizes, payloads = row
    decode_id(publisher_id)
    field_int(now_ms)
    _decode_sequences(sequences, _flat_count(payloads))
    _flat_common(common)


def encode_proposal(proposal: Proposal, encode_payload: EncodePayload) -> bytes:
    """cbor bytes `[origin, proposal_id, kind, *fields]`; what encodes decodes.

    Raises TypeError for a non-command, ValueError for a header or field `decode_proposal` would reject (a
    negative size, a priority above 255, an id that is not None/int/str/bytes/tuple, ...).
    """
    command_row = _encode_command(proposal.command, encode_payload)
    try:
        _check_header(proposal.origin, proposal.proposal_id)
        if command_row[0] == "enq":
            _check_enqueue(command_row)  # the hot path: the same checks, no objects built
        elif command_row[0] == "enqm":
            _check_enqueue_many(command_row)
        elif command_row[0] == "enqb":
            _check_enqueue_flat(command_row)
        else:
            _DECODERS[command_row[0]](command_row[1:], _keep_payload)
    except ProposalDecodeError as exc:
        raise ValueError(f"cannot encode {proposal!r:.200}: {exc}") from None
    return cbor2.dumps([proposal.origin, proposal.proposal_id, *command_row])


def decode_proposal(data: bytes, decode_payload: DecodePayload) -> Proposal:
    """Inverse of `encode_proposal`; raises ProposalDecodeError (only) for anything malformed."""
    try:
        row = cbor2.loads(data)
    except Exception as exc:  # cbor2 raises several types on garbage; report one
        raise ProposalDecodeError(f"bad cbor: {exc}") from exc
    if not isinstance(row, list) or len(row) < 3:
        raise ProposalDecodeError("a proposal is a list [origin, proposal_id, kind, *fields]")
    origin, proposal_id = _check_header(row[0], row[1])
    kind = row[2]
    decoder = _DECODERS.get(kind) if isinstance(kind, str) else None
    if decoder is None:
        raise ProposalDecodeError(f"unknown command kind {kind!r:.80}")
    try:
        command = decoder(row[3:], decode_payload)
    except ProposalDecodeError:
        raise
    except (ValueError, TypeError) as exc:  # e.g. a dataclass rejecting a value
        raise ProposalDecodeError(str(exc)) from exc
    return Proposal(origin, proposal_id, command)


def _read_head(data: bytes | bytearray | memoryview, offset: int) -> tuple[int, int, int]:
    """One cbor item head at `offset`: (major type, argument, offset after the head). Definite lengths only."""
    if offset >= len(data):
        raise ProposalDecodeError("truncated proposal header")
    initial = data[offset]
    major, info = initial >> 5, initial & 0x1F
    if info < 24:
        return major, info, offset + 1
    if info > 27:
        raise ProposalDecodeError("unsupported cbor head in proposal header")
    width = 1 << (info - 24)
    end = offset + 1 + width
    if end > len(data):
        raise ProposalDecodeError("truncated proposal header")
    return major, int.from_bytes(data[offset + 1 : end], "big"), end


def peek_proposal(data: bytes | bytearray | memoryview) -> tuple[str, int]:
    """(origin, proposal_id) of an encoded proposal, reading only the first few bytes.

    It checks the header only: a body that `decode_proposal` would reject is not noticed here.
    """
    major, length, offset = _read_head(data, 0)
    if major != 4 or length < 3:
        raise ProposalDecodeError("a proposal is a cbor array of at least 3 items")
    major, origin_size, offset = _read_head(data, offset)
    if major != 3 or offset + origin_size > len(data):
        raise ProposalDecodeError("proposal origin must be a text string")
    try:
        origin = str(data[offset : offset + origin_size], "utf-8")  # bytes, bytearray or memoryview
    except UnicodeDecodeError as exc:
        raise ProposalDecodeError("proposal origin is not utf-8") from exc
    major, proposal_id, _ = _read_head(data, offset + origin_size)
    if major != 0:
        raise ProposalDecodeError("proposal id must be an unsigned int")
    return _check_header(origin, proposal_id)
