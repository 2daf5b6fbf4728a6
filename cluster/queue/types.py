"""Data types of the queue state machine: arguments, messages, commands and effects.

Everything here is plain, immutable data that the broker builds (commands) or reads (effects): frozen, slotted
dataclasses, except the effects built once per message, `Deliver`, `Accepted` and `PagedOut`, which are NamedTuples
(as immutable, and built faster than a slotted dataclass; docs/benchmarks.md, "Frozen dataclasses off the
per-message path"). An effect is never changed once emitted. Three values built once per message (QueuedMessage, Enqueue,
Settle) are slotted dataclasses that are not frozen, for the same reason: nothing assigns to their fields; treat
them as values.
The machine in `cluster.queue.machine` consumes commands and returns effects; it performs no I/O, so the same
commands in the same order give the same effects on every replica. The paging commands (`PagingCommand`: they
are not `QueueCommand`s, which a replicated log carries) and effects (`PagedOut`, `SpilledOut`, `PageInWanted`,
`PagedDropped`) concern only a machine made with a page limit (cluster/queue/paging.py), never a replicated one.

Time only enters through the `now_ms` fields of commands. Ids are opaque hashables chosen by the broker
(`consumer_id`, `publisher_id`); message ids are assigned by the machine, strictly increasing from 1.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple, NewType

MsgId = NewType("MsgId", int)

Overflow = Literal["drop-head", "reject-publish", "reject-publish-dlx"]
OVERFLOW_MODES: Final = ("drop-head", "reject-publish", "reject-publish-dlx")

DeadLetterReason = Literal["rejected", "expired", "maxlen", "delivery_limit"]

DeadLetterStrategy = Literal["at-most-once", "at-least-once"]
DEAD_LETTER_STRATEGIES: Final = ("at-most-once", "at-least-once")

MAX_PRIORITY_LIMIT: Final = 255


@dataclass(frozen=True, slots=True)
class QueueArgs:
    """The x-arguments the machine understands (all optional), and the declare flag auto_delete.

    A dead-letter exchange of "" (the default exchange) is a valid DLX; None means no DLX, in which case messages
    that would be dead-lettered are reported as `Dropped` instead.

    `dead_letter_strategy` "at-least-once" takes effect only together with a DLX and overflow "reject-publish"
    (`holds_dead_letters`), as RabbitMQ 3.10 falls back to at-most-once otherwise: dead-lettered messages then stay
    in the queue's holding area until `SettleDeadLettered` (see cluster.queue.machine).

    `auto_delete` (the declare flag, fixed for the queue's life like `max_priority`) and `expires_ms` (x-expires,
    by argument or policy) are the machine's usage rules (cluster/queue/usage.py): it emits `QueueUnused` /
    `QueueExpired` and the broker deletes the queue.
    """

    message_ttl_ms: int | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: Overflow = "drop-head"
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    max_priority: int | None = None
    single_active_consumer: bool = False
    delivery_limit: int | None = None
    dead_letter_strategy: DeadLetterStrategy = "at-most-once"
    auto_delete: bool = False
    expires_ms: int | None = None

    def __post_init__(self) -> None:
        if self.overflow not in OVERFLOW_MODES:
            raise ValueError(f"unknown overflow mode {self.overflow!r}")
        if self.dead_letter_strategy not in DEAD_LETTER_STRATEGIES:
            raise ValueError(f"unknown dead letter strategy {self.dead_letter_strategy!r}")
        for name in ("message_ttl_ms", "max_length", "max_length_bytes", "delivery_limit", "expires_ms"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if self.max_priority is not None and not 0 <= self.max_priority <= MAX_PRIORITY_LIMIT:
            raise ValueError(f"max_priority must be within 0..{MAX_PRIORITY_LIMIT}")

    @property
    def holds_dead_letters(self) -> bool:
        """At-least-once dead lettering in effect (strategy, DLX and reject-publish all set)."""
        return (
            self.dead_letter_strategy == "at-least-once"
            and self.overflow == "reject-publish"
            and self.dead_letter_exchange is not None
        )


@dataclass(slots=True, unsafe_hash=True)  # per message: not frozen (see the header)
class QueuedMessage:
    """One message as the queue sees it; `payload` is opaque (the broker's message or a reference to it)."""

    payload: Any
    size_bytes: int
    persistent: bool
    priority: int = 0
    ttl_ms: int | None = None


# --- commands -------------------------------------------------------------------------------------------------


@dataclass(slots=True, unsafe_hash=True)  # per message: not frozen (see the header)
class Enqueue:
    """Publish one message. With (publisher_id, sequence), a sequence <= the publisher's high-water is a Duplicate."""

    message: QueuedMessage
    now_ms: int
    publisher_id: Hashable | None = None
    sequence: int | None = None


@dataclass(frozen=True, slots=True)
class EnqueueMany:
    """A run of one publisher's messages, applied exactly as `Enqueue(message, now_ms, publisher_id, sequence)` for
    each `(message, sequence)` pair in turn (the same effects, in the same order).

    Replicated mode proposes one per channel per queue per socket read, so a run of publishes is one log entry.
    `messages` and `sequences` have the same length (at least 1).
    """

    publisher_id: Hashable
    now_ms: int
    messages: tuple[QueuedMessage, ...]
    sequences: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.messages) != len(self.sequences) or not self.messages:
            raise ValueError("EnqueueMany needs as many sequences as messages, at least one")


@dataclass(frozen=True, slots=True)
class Attach:
    """Add a consumer. prefetch 0 = no per-consumer unacked limit; credit None = unlimited.

    Attaching an id that is already attached updates its prefetch/credit/priority/no_ack and keeps its unacked.
    """

    consumer_id: Hashable
    now_ms: int
    prefetch: int = 0
    credit: int | None = None
    priority: int = 0
    no_ack: bool = False


@dataclass(frozen=True, slots=True)
class Detach:
    """Remove a consumer; its unacked messages come back (redelivered, delivery count + 1)."""

    consumer_id: Hashable
    now_ms: int


@dataclass(frozen=True, slots=True)
class AddCredit:
    """Grant more credit to a consumer (channel-global QoS lives in the broker). No effect if credit is None."""

    consumer_id: Hashable
    credit: int


@dataclass(slots=True, unsafe_hash=True)  # per message: not frozen (see the header)
class Settle:
    """Acknowledge messages delivered to `consumer_id`. Unknown ids are ignored (effects may be replayed)."""

    consumer_id: Hashable
    msg_ids: tuple[MsgId, ...] | list[MsgId]


@dataclass(frozen=True, slots=True)
class Return:
    """Requeue messages: they go back to their original position, counting toward x-delivery-limit."""

    consumer_id: Hashable
    msg_ids: tuple[MsgId, ...] | list[MsgId]
    now_ms: int


@dataclass(frozen=True, slots=True)
class Discard:
    """Reject without requeue: dead-letter (reason "rejected") or drop when no DLX is configured."""

    consumer_id: Hashable
    msg_ids: tuple[MsgId, ...] | list[MsgId]
    now_ms: int


@dataclass(frozen=True, slots=True)
class Get:
    """basic.get: take the head message; without no_ack it stays unacked under `consumer_id`."""

    consumer_id: Hashable
    no_ack: bool
    now_ms: int


@dataclass(frozen=True, slots=True)
class Expire:
    """Advance time: every ready message whose expiry is <= now_ms is dead-lettered or dropped, and a queue unused
    for its x-expires is reported (`QueueExpired`)."""

    now_ms: int


@dataclass(frozen=True, slots=True)
class Purge:
    """Remove every ready message (unacked ones stay). `transient_only`: only the non-persistent ones, with no
    effect (a classic queue's transient messages do not outlive its node's restart; see the machine)."""

    transient_only: bool = False


@dataclass(frozen=True, slots=True)
class Recover:
    """Rebuild after a restart: the message becomes ready and is delivered with redelivered=True.

    `expiry_ms` (an extension of the interface) is the absolute expiry the message had, if the broker kept it.
    `redelivered=False` brings the message back unflagged (it takes its place by msg_id).
    """

    msg_id: MsgId
    message: QueuedMessage
    delivery_count: int = 0
    expiry_ms: int | None = None
    redelivered: bool = True


@dataclass(frozen=True, slots=True)
class SetArgs:
    """Replace the queue's arguments at this point of its log (policies). Limits apply at once; see the machine.

    `max_priority`, `single_active_consumer` and `auto_delete` are fixed at declaration (as in RabbitMQ, where no
    policy sets them): the machine keeps its own values of those fields. `now_ms` (0: not given, in entries
    written before it; the machine's clock then) starts a new x-expires period, as a policy change does in
    RabbitMQ.
    """

    args: QueueArgs
    now_ms: int = 0


@dataclass(frozen=True, slots=True)
class SettleDeadLettered:
    """At-least-once dead lettering: every target accepted these held messages; they leave the holding area.

    Unknown ids (already settled, or never held) are ignored.
    """

    msg_ids: tuple[MsgId, ...] | list[MsgId]


@dataclass(frozen=True, slots=True)
class Cancel:
    """basic.cancel of a consumer that still holds unacked messages: it leaves the consumers (no more deliveries;
    it no longer counts for auto-delete, x-expires or single active consumer) and keeps its unacked messages until
    they are settled, returned, or it is detached. A use of the queue (x-expires). Unknown or detached ids: no
    effect."""

    consumer_id: Hashable
    now_ms: int


@dataclass(frozen=True, slots=True)
class Declare:
    """queue.declare reached the queue (first or again; a single node also on recovery): a use (x-expires)."""

    now_ms: int


@dataclass(frozen=True, slots=True)
class MemoryPressure:
    """The node is short of memory (`floor` set) or no longer (None). While it lasts, a paging machine pages in
    only up to `floor` ready messages, and `Spill` moves what it holds above the floor to its tail."""

    floor: int | None


@dataclass(frozen=True, slots=True)
class Spill:
    """Under memory pressure: a paging machine moves up to `max_messages` of its newest ready messages above the
    floor to the front of its tail (`SpilledOut`). Nothing under no pressure, with a page-in outstanding, or on a
    machine that may not page."""

    max_messages: int


@dataclass(frozen=True, slots=True)
class PagedIn:
    """The answer to the outstanding `PageInWanted`: (msg_id, message, delivery_count) of each message read, in
    the request's order; one that could not be read is missing (it cannot come back). Ids not asked for are
    ignored, and so is an answer with nothing outstanding (a purge dropped the request)."""

    messages: tuple[tuple[MsgId, QueuedMessage, int], ...]


@dataclass(frozen=True, slots=True)
class RecoverPaged:
    """Recovery: messages that wait on disk, in ascending msg id order, become the paging machine's tail; they
    page in delivered redelivered (as `Recover`), and no id up to the last is handed out again. `msg_ids` is
    read once, while the command applies (an `array('q')` of a long queue's ids is not copied by the caller)."""

    msg_ids: Sequence[int]


QueueCommand = (
    Enqueue
    | EnqueueMany
    | Attach
    | Detach
    | AddCredit
    | Settle
    | Return
    | Discard
    | Get
    | Expire
    | Purge
    | Recover
    | SetArgs
    | SettleDeadLettered
    | Cancel
    | Declare
)

# The commands of paging (cluster/queue/paging.py): only for a machine in one process, never in a replicated log.
PagingCommand = MemoryPressure | Spill | PagedIn | RecoverPaged

# --- effects --------------------------------------------------------------------------------------------------


class Deliver(NamedTuple):  # per message: a NamedTuple (see the header)
    consumer_id: Hashable
    msg_id: MsgId
    message: QueuedMessage
    redelivered: bool
    delivery_count: int


@dataclass(frozen=True, slots=True)
class GetOk:
    consumer_id: Hashable
    msg_id: MsgId
    message: QueuedMessage
    redelivered: bool
    delivery_count: int
    remaining: int


@dataclass(frozen=True, slots=True)
class GetEmpty:
    consumer_id: Hashable


class Accepted(NamedTuple):  # per message: a NamedTuple (see the header)
    """The message was enqueued as `msg_id` (emitted for every accepted Enqueue, publisher_id may be None)."""

    publisher_id: Hashable | None
    sequence: int | None
    msg_id: MsgId


@dataclass(frozen=True, slots=True)
class Rejected:
    """The message was not enqueued (reason "maxlen" under reject-publish / reject-publish-dlx)."""

    publisher_id: Hashable | None
    sequence: int | None
    reason: str


@dataclass(frozen=True, slots=True)
class Duplicate:
    publisher_id: Hashable
    sequence: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Republish `message` to the DLX; the broker builds x-death. msg_id (extension) is None for a refused publish.

    `seq` numbers the queue's DeadLetter effects 1, 2, ... (a counter of the machine, in its snapshot, so the same
    on every replica): the sequence of an at-most-once copy, under the source queue's dead-letter publisher id, for
    the targets' publisher dedup. `held_seq` is set when the message stays held (at-least-once): its hold
    sequence, a counter of the log (1, 2, ... in hold order, the same on every replica), which is the copy's
    sequence then (the holding area is looked up by it). None: at most once.
    """

    message: QueuedMessage
    reason: DeadLetterReason
    delivery_count: int
    msg_id: MsgId | None = field(default=None)
    held_seq: int | None = field(default=None)
    seq: int = field(default=0)


@dataclass(frozen=True, slots=True)
class Dropped:
    """The message left the queue without dead-lettering (no DLX configured). reason as for DeadLetter."""

    msg_id: MsgId
    reason: DeadLetterReason


@dataclass(frozen=True, slots=True)
class Purged:
    count: int


@dataclass(frozen=True, slots=True)
class ActiveConsumerChanged:
    consumer_id: Hashable | None


@dataclass(frozen=True, slots=True)
class QueueUnused:
    """An auto-delete queue lost its last consumer (it had one): the broker deletes the queue (cluster: the node
    that proposed the command)."""


@dataclass(frozen=True, slots=True)
class QueueExpired:
    """x-expires: the queue had no consumer and no use (consume, cancel, get, declare) for `expires_ms` when an
    `Expire` ran: the broker deletes the queue (cluster: the node that proposed the Expire, its leader)."""


class PagedOut(NamedTuple):  # per message: a NamedTuple (see the header)
    """The message was enqueued as `msg_id` (as `Accepted`) into the paging machine's tail. Not `held`: the
    broker writes it to the tail on disk and forgets it; it comes back through `PageInWanted`. `held` (it has an
    expiry): the machine keeps it in memory, in its place, and the broker stores it as any accepted message."""

    publisher_id: Hashable | None
    sequence: int | None
    msg_id: MsgId
    message: QueuedMessage
    held: bool


@dataclass(frozen=True, slots=True)
class SpilledOut:
    """`Spill` withdrew these ready messages, (msg_id, message, delivery_count) in ascending msg id order, to the
    front of the tail: the broker writes each to disk and forgets it; they page in first, with their delivery
    count and redelivered flag."""

    messages: tuple[tuple[MsgId, QueuedMessage, int], ...]


@dataclass(frozen=True, slots=True)
class PageInWanted:
    """Read these tail messages back (written at `PagedOut`, `SpilledOut` or recovery), in this order, and answer
    with one `PagedIn`. At most one is outstanding per machine."""

    msg_ids: tuple[MsgId, ...]


@dataclass(frozen=True, slots=True)
class PagedDropped:
    """`Purge` dropped the tail: these of its messages have a record on disk (every one not held, and the held
    persistent ones), which the broker removes."""

    msg_ids: tuple[MsgId, ...]


QueueEffect = (
    Deliver
    | GetOk
    | GetEmpty
    | Accepted
    | Rejected
    | Duplicate
    | DeadLetter
    | Dropped
    | Purged
    | ActiveConsumerChanged
    | QueueUnused
    | QueueExpired
    | PagedOut
    | SpilledOut
    | PageInWanted
    | PagedDropped
)
