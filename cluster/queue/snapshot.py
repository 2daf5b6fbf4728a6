"""Snapshot and restore of a `Queue`, so the log behind it can be truncated.

`snapshot_queue` returns a dict of cbor-able primitives only (ints, strs, bools, None, lists, dicts) provided the
opaque parts are: message payloads go through `encode_payload` and consumer/publisher ids through `encode_id`
(both default to identity, so by default payloads and ids must themselves be cbor-able, e.g. bytes/str/int).
Note that cbor turns tuples into lists: pass `decode_id` to restore if ids are tuples.

The restored machine is identical in behaviour: same ready order, unacked sets, consumer limits, round-robin ring
positions, active consumer, dedup high-waters (in LRU order), msg_id counter and clock. Internal garbage (lazily
removed entries) is not carried over, which does not change any future effect. The dead-letter holding area
(at-least-once) travels as `held` rows in hold order; `ttl_epoch` is the first msg id whose expiry came from the
current message TTL (older ones are restored as plain entries, see `_is_compact`). Both keys are optional, so
snapshots written before them restore. So are the usage keys "had_consumer" and "last_used_ms", and the args'
"auto_delete" and "expires_ms" (cluster/queue/usage.py), written only when auto-delete or x-expires is set, and
"dead_letter_seq" (the latest `DeadLetter.seq`, cluster/queue/dead_letters.py), written once the queue dead-lettered
a message: the snapshot of a queue without them is the bytes written before they existed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from typing import Any, Final, TypeVar

from cluster.queue.consumers import Consumer
from cluster.queue.holding import HeldLetter
from cluster.queue.ready import GONE, READY, REDELIVERED, UNACKED, Entry
from cluster.queue.types import MsgId, QueueArgs, QueuedMessage

SNAPSHOT_VERSION: Final = 1

# The queue machine (cluster.queue.machine.Queue), which imports this module: its fields are read and set here by
# name, so it is typed loosely rather than imported back (no import cycle).
_Queue = Any
_Q = TypeVar("_Q")

_Encode = Callable[[Any], Any]


def _identity(value: Any) -> Any:
    return value


def _entry_row(entry: Entry, encode_payload: _Encode) -> list[Any]:
    message = entry.message
    return [
        entry.msg_id,
        encode_payload(message.payload),
        message.size_bytes,
        message.persistent,
        message.priority,
        message.ttl_ms,
        entry.delivery_count,
        entry.expiry_ms,
        entry.redelivered,
    ]


def _entry_from_row(row: list[Any], decode_payload: _Encode, state: int) -> Entry:
    msg_id, payload, size_bytes, persistent, priority, ttl_ms, delivery_count, expiry_ms, redelivered = row
    message = QueuedMessage(decode_payload(payload), size_bytes, persistent, priority, ttl_ms)
    flags = state | (REDELIVERED if redelivered else 0)
    return Entry(MsgId(msg_id), message, delivery_count, expiry_ms, flags)


def _is_compact(entry: Entry, queue_ttl_ms: int | None, ttl_epoch_msg_id: int) -> bool:
    """Whether the entry was (and can again be) stored in the compact form of a fresh message (not if it came in
    under an earlier message TTL: the compact column needs expiries in msg id order)."""
    if entry.flags != READY or entry.delivery_count or entry.msg_id < ttl_epoch_msg_id:
        return False
    if entry.expiry_ms is None:
        return True
    ttl_ms = entry.message.ttl_ms
    return queue_ttl_ms is not None and (ttl_ms is None or ttl_ms >= queue_ttl_ms)


def snapshot_queue(
    queue: _Queue, encode_payload: _Encode | None = None, encode_id: _Encode | None = None
) -> dict[str, Any]:
    enc_payload = encode_payload or _identity
    enc_id = encode_id or _identity
    consumers = []
    for consumer in queue._consumers.values():
        consumers.append(
            [
                enc_id(consumer.consumer_id),
                consumer.prefetch,
                consumer.credit,
                consumer.priority,
                consumer.no_ack,
                consumer.attach_seq,
                consumer.attached,
                [_entry_row(consumer.unacked[msg_id], enc_payload) for msg_id in consumer.unacked],
            ]
        )
    rings = [
        [priority, [enc_id(member.consumer_id) for member in members]]
        for priority, members in queue._rings.iter_rings()
    ]
    active = queue._active
    optional: dict[str, Any] = {}
    if queue.args.auto_delete:
        optional["had_consumer"] = queue._had_consumer
    if queue.args.expires_ms is not None:
        optional["last_used_ms"] = queue._last_used_ms
    if queue._dead_letter_seq:
        optional["dead_letter_seq"] = queue._dead_letter_seq
    return {
        "version": SNAPSHOT_VERSION,
        "name": queue.name,
        "args": _args_row(queue.args),
        "publishers_max": queue.publishers_max,
        "next_msg_id": queue._next_msg_id,
        "attach_seq": queue._attach_seq,
        "now_ms": queue._now_ms,
        "ready": [_entry_row(entry, enc_payload) for entry in queue._ready.iter_in_order()],
        "consumers": consumers,
        "rings": rings,
        "has_active": active is not None,
        "active": enc_id(active.consumer_id) if active is not None else None,
        "publishers": [[enc_id(pid), seq] for pid, seq in queue._publishers.items()],
        "ttl_epoch": queue._ttl_epoch_msg_id,
        "hold_dead_letters": queue.hold_dead_letters,
        "held_last_seq": queue._held.last_seq,
        "held": [[h.seq, h.reason, _entry_row(h.entry, enc_payload)] for h in queue._held],
        **optional,
    }


def _args_row(args: QueueArgs) -> dict[str, Any]:
    """The arguments as a dict, without auto_delete and expires_ms when they are not set (as before them)."""
    row = dataclasses.asdict(args)
    if not args.auto_delete:
        del row["auto_delete"]
    if args.expires_ms is None:
        del row["expires_ms"]
    return row


def restore_queue(
    cls: Callable[..., _Q],
    snapshot: dict[str, Any],
    decode_payload: _Encode | None = None,
    decode_id: Callable[[Any], Hashable] | None = None,
) -> _Q:
    if snapshot.get("version") != SNAPSHOT_VERSION:
        raise ValueError(f"unsupported queue snapshot version {snapshot.get('version')!r}")
    dec_payload = decode_payload or _identity
    dec_id = decode_id or _identity
    made = cls(snapshot["name"], QueueArgs(**snapshot["args"]), snapshot["publishers_max"])
    queue: Any = made
    queue._next_msg_id = snapshot["next_msg_id"]
    queue._attach_seq = snapshot["attach_seq"]
    queue._now_ms = snapshot["now_ms"]
    queue._ttl_epoch_msg_id = ttl_epoch = snapshot.get("ttl_epoch", 0)
    for row in snapshot["ready"]:
        entry = _entry_from_row(row, dec_payload, READY)
        if _is_compact(entry, queue.args.message_ttl_ms, ttl_epoch):
            queue._ready.push_new(entry.msg_id, entry.message, entry.expiry_ms)
        else:
            queue._ready.push_returned(entry)  # same position: delivery order is by msg_id either way
    for cid_raw, prefetch, credit, priority, no_ack, attach_seq, attached, unacked_rows in snapshot[
        "consumers"
    ]:
        consumer = Consumer(dec_id(cid_raw), prefetch, credit, priority, no_ack, attach_seq, attached)
        for row in unacked_rows:
            entry = _entry_from_row(row, dec_payload, UNACKED)
            consumer.unacked[entry.msg_id] = entry
        queue._consumers[consumer.consumer_id] = consumer
        queue._unacked_count += len(consumer.unacked)
        if attached:
            queue._attached_count += 1
    for priority, member_ids in snapshot["rings"]:
        queue._rings.restore_ring(priority, [queue._consumers[dec_id(cid)] for cid in member_ids])
    if snapshot["has_active"]:
        queue._active = queue._consumers[dec_id(snapshot["active"])]
    for pid_raw, sequence in snapshot["publishers"]:
        queue._publishers[dec_id(pid_raw)] = sequence
    held = [
        HeldLetter(seq, reason, _entry_from_row(row, dec_payload, GONE))
        for seq, reason, row in snapshot.get("held", [])
    ]
    queue._held.restore(snapshot.get("held_last_seq", 0), held)
    queue.hold_dead_letters = bool(snapshot.get("hold_dead_letters", False))
    queue._had_consumer = bool(snapshot.get("had_consumer", False))
    queue._last_used_ms = snapshot.get("last_used_ms", queue._now_ms)
    queue._dead_letter_seq = snapshot.get("dead_letter_seq", 0)
    return made
