"""The queue state machine: `Queue.apply(command) -> list[effect]`, deterministic and free of I/O.

Classic, quorum and mirrored queues all run this machine; only how the commands are replicated differs. The same
commands in the same order produce the same effects on every replica: there is no clock (time comes from the
`now_ms` of commands, clamped to never go back), no randomness and no iteration over unordered containers.

How a command runs: advance time and expire what is due, change state, then hand ready messages to consumers with
capacity (see `consumers.ConsumerRings`), highest consumer priority first and round-robin among equals. Ready
messages live in `ready.ReadyStore` (priority levels, ascending msg_id, requeued messages back at their place). The
queries are in `queue_views.QueueViews`, how messages are lost (dead letters, holding, length limits) in
`dead_letters.DeadLettering`, whether the queue is still used (auto-delete, x-expires: `Cancel`, `Declare`,
`QueueUnused`, `QueueExpired`, `next_expiry_ms`) in `usage.QueueUsage`, `Purge`/`SetArgs` in
`admin.QueueAdmin`, and which messages of a long queue wait outside it (a machine made with `page_limit`: `Enqueue`
past the limit joins the tail, `PageInWanted`/`PagedIn`, `Spill` under `MemoryPressure`) in `paging.QueuePaging`:
mixins of `Queue`.

Hot paths (each gives exactly the effects and state of the plain path; tests/queue/test_batch_paths.py): a new
message with nothing ready ahead of it and no expiry goes straight to the head consumer, never through the store;
a consumer alone in the top ring takes a run of messages per dispatch pass; and an `EnqueueMany` on a queue without
length limits, queue TTL or a full holding area (nothing can expire or be lost while it runs) advances the clock
and updates the publisher LRU once per batch.

Semantics chosen where RabbitMQ leaves room (the reference model in tests/queue mirrors them):
- A message expires when now_ms >= enqueue time + min(x-message-ttl, per-message ttl). Expired messages are never
  delivered; as in RabbitMQ, a ttl of 0 still lets a message go straight to a consumer waiting at publish time.
- Unacked messages do not expire; a returned message keeps its original expiry.
- Length limits count ready messages only (as classic queues). reject-publish refuses a message that would take
  the queue over a limit; drop-head enqueues, delivers, then drops heads until within the limits.
- A message that would be dead-lettered becomes `DeadLetter` when a DLX is configured, else `Dropped`.
- x-delivery-limit: Return and Detach add 1 to delivery_count; above the limit the message is lost that way.
- Publisher dedup keeps one high-water sequence per publisher, at most `publishers_max` publishers, evicting the
  least recently used one (a retry from an evicted publisher is then accepted again: at-least-once, never lost).
- Single active consumer: the first attached is active; when it detaches, the attached consumer with the highest
  priority (then the earliest attached) takes over.
- Purge and SetArgs (policies): cluster/queue/admin.py; auto-delete and x-expires: cluster/queue/usage.py.
- At-least-once dead lettering (`QueueArgs.holds_dead_letters`, and only on a machine made with
  `hold_dead_letters=True`, as `ReplicatedQueue` makes them: a single node dead-letters synchronously, in one
  process, so it never holds): a lost message moves to the holding area
  (`holding.DeadLetterHolding`) and its `DeadLetter` carries `held_seq`; `SettleDeadLettered` removes it. Held
  messages count against max-length/max-length-bytes; past DEAD_LETTER_HELD_MAX held, publishes are refused
  (reason "dead_letter_held"). Purge leaves them. A SetArgs that turns the strategy off releases them as
  at-most-once `DeadLetter`s (or `Dropped` without a DLX), as RabbitMQ does when the strategy changes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Any, Final

from cluster.queue.admin import QueueAdmin
from cluster.queue.consumers import Consumer, ConsumerRings
from cluster.queue.dead_letters import DeadLettering
from cluster.queue.holding import DEAD_LETTER_HELD_MAX, DeadLetterHolding
from cluster.queue.paging import QueuePaging
from cluster.queue.queue_views import QueueViews
from cluster.queue.ready import (
    GONE,
    READY,
    REDELIVERED,
    STATE_MASK,
    UNACKED,
    Entry,
    ReadyStore,
)
from cluster.queue.snapshot import restore_queue, snapshot_queue
from cluster.queue.types import (
    Accepted,
    ActiveConsumerChanged,
    AddCredit,
    Attach,
    Cancel,
    Declare,
    Deliver,
    Detach,
    Discard,
    Duplicate,
    Enqueue,
    EnqueueMany,
    Expire,
    Get,
    GetEmpty,
    GetOk,
    MsgId,
    PagingCommand,
    Purge,
    QueueArgs,
    QueueCommand,
    QueuedMessage,
    QueueEffect,
    Recover,
    Rejected,
    Return,
    SetArgs,
    Settle,
    SettleDeadLettered,
)
from cluster.queue.usage import QueueUsage

PUBLISHERS_MAX_DEFAULT: Final = 10_000

_Effects = list[QueueEffect]


class Queue(QueueViews, DeadLettering, QueueUsage, QueuePaging, QueueAdmin):
    """One queue's state. Mutable for speed; use snapshot()/restore() to copy it."""

    __slots__ = (
        "_active",
        "_attach_seq",
        "_attached_count",
        "_consumers",
        "_dead_letter_seq",
        "_had_consumer",
        "_handlers",
        "_has_limits",
        "_held",
        "_last_used_ms",
        "_next_msg_id",
        "_now_ms",
        "_page_floor",
        "_page_limit",
        "_page_out_at",
        "_publishers",
        "_ready",
        "_recent_publisher",
        "_rings",
        "_tail",
        "_ttl_epoch_msg_id",
        "_unacked_count",
        "args",
        "hold_dead_letters",
        "name",
        "publishers_max",
    )

    def __init__(
        self,
        name: str,
        args: QueueArgs | None = None,
        publishers_max: int = PUBLISHERS_MAX_DEFAULT,
        hold_dead_letters: bool = False,
        page_limit: int = 0,
    ):
        if publishers_max < 1:
            raise ValueError("publishers_max must be >= 1")
        self.name = name
        self.args = args if args is not None else QueueArgs()
        self.publishers_max = publishers_max
        self._ready = ReadyStore(self.args.max_priority, self.args.message_ttl_ms)
        self._consumers: dict[Hashable, Consumer] = {}
        self._rings = ConsumerRings()
        self._attached_count = 0
        self._unacked_count = 0
        self._next_msg_id = 1
        self._attach_seq = 0
        self._now_ms = 0
        self._active: Consumer | None = None
        self._publishers: OrderedDict[Hashable, int] = OrderedDict()  # least recently used first
        self._recent_publisher: Hashable = None  # the id object last remembered (its key is the most recent)
        self._has_limits = self.args.max_length is not None or self.args.max_length_bytes is not None
        self._held = DeadLetterHolding()
        self._dead_letter_seq = 0  # the latest DeadLetter's sequence (dead_letters.py)
        self.hold_dead_letters = hold_dead_letters  # whether at-least-once args make this machine hold
        self._ttl_epoch_msg_id = 0  # messages from this id on got their expiry from the current message TTL
        self._had_consumer = False  # usage rules (cluster/queue/usage.py): a consumer was attached once
        self._last_used_ms: int | None = None  # and the last use (x-expires)
        self._init_paging(page_limit)  # (cluster/queue/paging.py)
        self._handlers: dict[type, Callable[[Any, _Effects], None]] = {
            Enqueue: self._enqueue,
            EnqueueMany: self._enqueue_many,
            Settle: self._settle,
            Attach: self._attach,
            Detach: self._detach,
            AddCredit: self._add_credit,
            Return: self._return,
            Discard: self._discard,
            Get: self._get,
            Expire: self._expire,
            Purge: self._purge,
            Recover: self._recover,
            SetArgs: self._set_args,
            SettleDeadLettered: self._settle_dead_lettered,
            Cancel: self._cancel,
            Declare: self._declare,
            **self._paging_handlers(),
        }

    # --- public API -----------------------------------------------------------------------------------------

    def apply(self, command: QueueCommand | PagingCommand) -> list[QueueEffect]:
        handler = self._handlers.get(type(command))
        if handler is None:
            raise TypeError(f"not a queue command: {command!r}")
        out: _Effects = []
        handler(command, out)
        if self._tail is not None:
            self._page_in(out)
        return out

    @property
    def msg_ids_used(self) -> int:
        """How many message ids the queue handed out in its life (the last id; read-only)."""
        return self._next_msg_id - 1

    def snapshot(
        self,
        encode_payload: Callable[[Any], Any] | None = None,
        encode_id: Callable[[Hashable], Any] | None = None,
    ) -> dict[str, Any]:
        """cbor-able state; see cluster.queue.snapshot for the payload/id encoding rules."""
        if self._tail is not None:
            raise ValueError("a machine with a paged tail is not snapshotted")
        return snapshot_queue(self, encode_payload, encode_id)

    @classmethod
    def restore(
        cls,
        snapshot: dict[str, Any],
        decode_payload: Callable[[Any], Any] | None = None,
        decode_id: Callable[[Any], Hashable] | None = None,
    ) -> Queue:
        return restore_queue(cls, snapshot, decode_payload, decode_id)

    # --- commands -------------------------------------------------------------------------------------------

    def _enqueue(self, command: Enqueue, out: _Effects) -> None:
        self._enqueue_message(command.message, command.now_ms, command.publisher_id, command.sequence, out)

    def _enqueue_many(self, command: EnqueueMany, out: _Effects) -> None:
        """As `_enqueue_message` for each message in turn. Without length limits, queue TTL or a full holding area
        (nothing can expire or be lost while the batch runs), the batch's common work is done once: the clock
        advance and the publisher's LRU update, and a message goes straight to a consumer with room when none is
        ready ahead of it. A message with its own TTL hands the rest of the batch to the per-message path."""
        publisher_id, messages, sequences = command.publisher_id, command.messages, command.sequences
        if len(messages) != len(sequences):
            raise ValueError("EnqueueMany needs as many sequences as messages")
        ready = self._ready
        start = 0
        if not (self._has_limits or ready.queue_ttl_ms is not None or self._held.count >= DEAD_LETTER_HELD_MAX
                or ready.count + len(messages) > self._page_out_at):  # (none of them can join a tail)
            self._advance(command.now_ms, out)
            start = self._enqueue_run(publisher_id, messages, sequences, out)
        for index in range(start, len(messages)):
            self._enqueue_message(messages[index], command.now_ms, publisher_id, sequences[index], out)

    def _enqueue_run(self, publisher_id: Hashable, messages: Sequence[QueuedMessage], sequences: Sequence[int],
                     out: _Effects) -> int:
        """The batch path of `_enqueue_many` (its conditions hold); returns the index it stopped at (a message with
        its own TTL, or the end)."""
        ready = self._ready
        rings = self._rings
        consumer = rings.head()
        if consumer is not None and ready.count:
            return 0  # a consumer with room while messages are ready: leave it to the per-message path
        room = rings.room_alone(consumer) if consumer is not None else 0
        tracked = publisher_id is not None
        high_water = self._publishers.get(publisher_id) if tracked else None
        accepted_high: int | None = None
        next_msg_id = self._next_msg_id
        stopped = len(messages)
        for index, message in enumerate(messages):
            if message.ttl_ms is not None:
                stopped = index
                break
            sequence = sequences[index]
            if tracked:
                if high_water is not None and sequence <= high_water:
                    out.append(Duplicate(publisher_id, sequence))
                    continue
                high_water = accepted_high = sequence
            msg_id = MsgId(next_msg_id)
            next_msg_id += 1
            out.append(Accepted(publisher_id, sequence, msg_id))
            if consumer is None:
                ready.push_new(msg_id, message, None)
                continue
            self._hand_over_new(consumer, msg_id, message, out)
            room -= 1
            if not room:
                rings.rotate(consumer)
                consumer = rings.head()
                room = rings.room_alone(consumer) if consumer is not None else 0
        # (no rotation left to do: a consumer that is not alone turns after each message, and turning a lone
        # consumer that still has room leaves its ring as it is)
        self._next_msg_id = next_msg_id
        if accepted_high is not None:
            self._remember_publisher(publisher_id, accepted_high)
        return stopped

    def _hand_over_new(self, consumer: Consumer, msg_id: MsgId, message: QueuedMessage, out: _Effects) -> None:
        """Deliver a message that was never ready (nothing ahead of it, no expiry) to `consumer`, which has room;
        the caller rotates the ring."""
        if consumer.credit is not None:
            consumer.credit -= 1
        out.append(Deliver(consumer.consumer_id, msg_id, message, False, 0))
        if not consumer.no_ack:
            consumer.unacked[msg_id] = Entry(msg_id, message, 0, None, UNACKED)
            self._unacked_count += 1

    def _enqueue_message(self, message: QueuedMessage, command_now_ms: int, publisher_id: Hashable | None,
                         sequence: int | None, out: _Effects) -> None:
        now_ms = self._advance(command_now_ms, out)
        tracked = publisher_id is not None and sequence is not None
        if tracked:
            high_water = self._publishers.get(publisher_id)
            if high_water is not None and sequence <= high_water:  # type: ignore[operator]
                out.append(Duplicate(publisher_id, sequence))  # type: ignore[arg-type]
                return
        args = self.args
        if self._held.count >= DEAD_LETTER_HELD_MAX:
            out.append(Rejected(publisher_id, sequence, "dead_letter_held"))
            return
        if self._has_limits and args.overflow != "drop-head" and self._would_overflow(message.size_bytes):
            out.append(Rejected(publisher_id, sequence, "maxlen"))
            if args.overflow == "reject-publish-dlx" and args.dead_letter_exchange is not None:
                out.append(self._dead_letter(message, "maxlen", 0, None))
            return
        if tracked:
            self._remember_publisher(publisher_id, sequence)  # type: ignore[arg-type]
        msg_id = MsgId(self._next_msg_id)
        self._next_msg_id = msg_id + 1
        ttl_ms = args.message_ttl_ms
        if message.ttl_ms is not None and (ttl_ms is None or message.ttl_ms < ttl_ms):
            ttl_ms = message.ttl_ms
        expiry_ms = None if ttl_ms is None else now_ms + ttl_ms
        if self._ready.count >= self._page_out_at and (expiry_ms is None or self._tail is not None):
            self._page_out(msg_id, message, expiry_ms, publisher_id, sequence, out)  # (cluster/queue/paging.py)
            return
        out.append(Accepted(publisher_id, sequence, msg_id))
        if expiry_ms is None and not self._ready.count:
            consumer = self._rings.head()
            if consumer is not None:  # nothing ready ahead of it: straight to the consumer
                self._hand_over_new(consumer, msg_id, message, out)
                self._rings.rotate(consumer)
                return
        self._ready.push_new(msg_id, message, expiry_ms)
        self._deliver(out)
        if expiry_ms is not None and expiry_ms <= now_ms:
            self._expire_due(out)
        if self._has_limits:
            self._drop_heads_over_limit(out)

    def _attach(self, command: Attach, out: _Effects) -> None:
        self._used(self._advance(command.now_ms, out))
        self._had_consumer = True
        consumer_id = command.consumer_id
        previous = self._consumers.get(consumer_id)
        keeps_seat = previous is not None and previous.attached
        if keeps_seat:
            assert previous is not None
            attach_seq = previous.attach_seq
        else:
            self._attach_seq += 1
            attach_seq = self._attach_seq
            self._attached_count += 1
        consumer = Consumer(
            consumer_id, command.prefetch, command.credit, command.priority, command.no_ack, attach_seq, True
        )
        if previous is not None:
            consumer.unacked = previous.unacked
            previous.attached = False
        self._consumers[consumer_id] = consumer
        if self.args.single_active_consumer:
            if self._active is None:
                self._active = consumer
                out.append(ActiveConsumerChanged(consumer_id))
            elif self._active is previous:
                self._active = consumer
        self._offer(consumer)
        self._deliver(out)

    def _detach(self, command: Detach, out: _Effects) -> None:
        now_ms = self._advance(command.now_ms, out)
        consumer = self._consumers.pop(command.consumer_id, None)
        if consumer is None:
            return
        was_attached = consumer.attached
        if was_attached:
            consumer.attached = False
            self._attached_count -= 1
            self._used(now_ms)
        unacked = consumer.unacked
        self._unacked_count -= len(unacked)
        for msg_id in sorted(unacked):
            self._requeue(unacked[msg_id], out)
        unacked.clear()
        if consumer is self._active:
            self._choose_active(out)
        self._expire_due(out)
        self._deliver(out)
        if was_attached:
            self._lost_consumer(out)

    def _add_credit(self, command: AddCredit, out: _Effects) -> None:
        consumer = self._consumers.get(command.consumer_id)
        if consumer is None or consumer.credit is None:
            return
        consumer.credit += command.credit
        self._offer(consumer)
        self._deliver(out)

    def _settle(self, command: Settle, out: _Effects) -> None:
        consumer = self._consumers.get(command.consumer_id)
        if consumer is None:
            return
        unacked = consumer.unacked
        unacked_before = len(unacked)
        take, not_state, gone = unacked.pop, ~STATE_MASK, GONE  # (locals: a multiple ack settles hundreds)
        for msg_id in command.msg_ids:
            entry = take(msg_id, None)
            if entry is not None:
                entry.flags = entry.flags & not_state | gone
        self._unacked_count -= unacked_before - len(unacked)
        if consumer.attached:
            if not consumer.in_ring:
                self._offer(consumer)
            if self._ready.count:
                self._deliver(out)
        elif not unacked and self._consumers.get(consumer.consumer_id) is consumer:
            del self._consumers[consumer.consumer_id]

    def _return(self, command: Return, out: _Effects) -> None:
        self._advance(command.now_ms, out)
        consumer = self._consumers.get(command.consumer_id)
        if consumer is None:
            return
        for entry in self._take_unacked(consumer, command.msg_ids):
            self._requeue(entry, out)
        self._expire_due(out)
        self._after_unacked_shrank(consumer, out)

    def _discard(self, command: Discard, out: _Effects) -> None:
        self._advance(command.now_ms, out)
        consumer = self._consumers.get(command.consumer_id)
        if consumer is None:
            return
        for entry in self._take_unacked(consumer, command.msg_ids):
            self._lose(entry, "rejected", out)
        self._after_unacked_shrank(consumer, out)

    def _take_unacked(self, consumer: Consumer, msg_ids: Iterable[MsgId]) -> Iterator[Entry]:
        """Remove `msg_ids` from `consumer`'s unacked set, yielding each entry it held (unknown ids are skipped)."""
        unacked = consumer.unacked
        for msg_id in msg_ids:
            entry = unacked.pop(msg_id, None)
            if entry is not None:
                self._unacked_count -= 1
                yield entry

    def _get(self, command: Get, out: _Effects) -> None:
        self._used(self._advance(command.now_ms, out))
        consumer_id = command.consumer_id
        entry = self._take_ready(out)
        if entry is None:
            out.append(GetEmpty(consumer_id))
            return
        redelivered = bool(entry.flags & REDELIVERED)
        if command.no_ack:
            entry.flags = (entry.flags & ~STATE_MASK) | GONE
        else:
            holder = self._consumers.get(consumer_id)
            if holder is None:
                holder = Consumer(consumer_id, 0, None, 0, False, 0, False)
                self._consumers[consumer_id] = holder
            entry.flags = (entry.flags & ~STATE_MASK) | UNACKED
            holder.unacked[entry.msg_id] = entry
            self._unacked_count += 1
        out.append(
            GetOk(
                consumer_id, entry.msg_id, entry.message, redelivered, entry.delivery_count, self._ready.count
            )
        )

    def _expire(self, command: Expire, out: _Effects) -> None:
        self._advance(command.now_ms, out)
        if self.args.expires_ms is not None:
            self._check_expired(out)

    def _recover(self, command: Recover, out: _Effects) -> None:
        msg_id = command.msg_id
        if msg_id >= self._next_msg_id:
            self._next_msg_id = msg_id + 1
        flags = READY | REDELIVERED if command.redelivered else READY
        entry = Entry(msg_id, command.message, command.delivery_count, command.expiry_ms, flags)
        self._ready.push_returned(entry)
        self._expire_due(out)
        self._deliver(out)

    # --- helpers --------------------------------------------------------------------------------------------

    def _advance(self, now_ms: int, out: _Effects) -> int:
        if now_ms > self._now_ms:
            self._now_ms = now_ms
        else:
            now_ms = self._now_ms
        ready = self._ready
        heap = ready.expiry_heap
        if ready.queue_ttl_ms is not None or (heap and heap[0].expiry_ms <= now_ms):  # type: ignore[operator]
            self._expire_due(out)
        return now_ms

    def _expire_due(self, out: _Effects) -> None:
        ready = self._ready
        if ready.expiry_heap or ready.queue_ttl_ms is not None:
            for entry in ready.pop_expired(self._now_ms):
                self._lose(entry, "expired", out)

    def _take_ready(self, out: _Effects) -> Entry | None:
        """Pop the head ready message; a message past its expiry is expired, never handed out."""
        ready = self._ready
        now_ms = self._now_ms
        while True:
            entry = ready.pop_head()
            if entry is None or entry.expiry_ms is None or entry.expiry_ms >= now_ms:
                return entry
            self._lose(entry, "expired", out)

    def _deliver(self, out: _Effects) -> None:
        """Hand ready messages to consumers with room until one side runs out (the hot path, kept inline). A
        consumer alone in the top ring takes a run of messages, up to its room, before the ring turns."""
        ready = self._ready
        rings = self._rings
        now_ms = self._now_ms
        while ready.count:
            consumer = rings.head()
            if consumer is None:
                return
            room = room_before = rings.room_alone(consumer)
            unacked = None if consumer.no_ack else consumer.unacked
            consumer_id = consumer.consumer_id
            while room and ready.count:
                entry = ready.pop_head()
                assert entry is not None
                expiry_ms = entry.expiry_ms
                if expiry_ms is not None and expiry_ms < now_ms:
                    self._lose(entry, "expired", out)
                    continue
                room -= 1
                flags = entry.flags
                msg_id = entry.msg_id
                out.append(Deliver(consumer_id, msg_id, entry.message, bool(flags & REDELIVERED),
                                   entry.delivery_count))
                if unacked is None:
                    entry.flags = (flags & ~STATE_MASK) | GONE
                else:
                    entry.flags = (flags & ~STATE_MASK) | UNACKED
                    unacked[msg_id] = entry
                    self._unacked_count += 1
                if consumer.credit is not None:
                    consumer.credit -= 1
            if room != room_before:  # (only expired messages met: the ring does not turn)
                rings.rotate(consumer)

    def _requeue(self, entry: Entry, out: _Effects) -> None:
        entry.delivery_count += 1
        entry.flags |= REDELIVERED
        limit = self.args.delivery_limit
        if limit is not None and entry.delivery_count > limit:
            self._lose(entry, "delivery_limit", out)
        else:
            self._ready.push_returned(entry)

    def _after_unacked_shrank(self, consumer: Consumer, out: _Effects) -> None:
        if consumer.attached:
            self._offer(consumer)
            self._deliver(out)
        elif not consumer.unacked and self._consumers.get(consumer.consumer_id) is consumer:
            del self._consumers[consumer.consumer_id]

    def _offer(self, consumer: Consumer) -> None:
        if not self.args.single_active_consumer or self._active is consumer:
            self._rings.offer(consumer)

    def _choose_active(self, out: _Effects) -> None:
        best: Consumer | None = None
        for candidate in self._consumers.values():
            if candidate.attached and (
                best is None
                or candidate.priority > best.priority
                or (candidate.priority == best.priority and candidate.attach_seq < best.attach_seq)
            ):
                best = candidate
        self._active = best
        out.append(ActiveConsumerChanged(best.consumer_id if best is not None else None))
        if best is not None:
            self._rings.offer(best)

    def _remember_publisher(self, publisher_id: Hashable, sequence: int) -> None:
        publishers = self._publishers
        if publisher_id is self._recent_publisher:  # already the most recently used (a batch's run): no reorder
            publishers[publisher_id] = sequence
            return
        self._recent_publisher = publisher_id
        if publisher_id in publishers:
            publishers.move_to_end(publisher_id)
        elif len(publishers) >= self.publishers_max:
            publishers.popitem(last=False)
        publishers[publisher_id] = sequence
