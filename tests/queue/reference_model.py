"""A deliberately naive reference model of the queue machine: plain lists and dicts, full scans and sorts.

It mirrors the documented semantics of `cluster.queue.machine` step by step (same order of effects), but with
none of its data structures: the ready set is an unordered list sorted on every take, the round-robin ring is a
list of consumer ids, expiry is a scan. Single active consumer is not modelled (unit tests cover it), and
basic.get holders use ids distinct from consumer ids.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from cluster.queue import (
    Accepted,
    AddCredit,
    Attach,
    DeadLetter,
    Deliver,
    Detach,
    Discard,
    Dropped,
    Duplicate,
    Enqueue,
    Expire,
    Get,
    GetEmpty,
    GetOk,
    MsgId,
    Purge,
    Purged,
    QueueArgs,
    QueueCommand,
    QueuedMessage,
    QueueEffect,
    Rejected,
    Return,
    Settle,
)


@dataclass
class ModelMessage:
    msg_id: int
    message: QueuedMessage
    expiry_ms: int | None
    delivery_count: int = 0
    redelivered: bool = False


@dataclass
class ModelConsumer:
    consumer_id: Hashable
    prefetch: int
    credit: int | None
    priority: int
    no_ack: bool


@dataclass
class Model:
    args: QueueArgs
    publishers_max: int = 10_000
    now_ms: int = 0
    next_id: int = 1
    ready: list[ModelMessage] = field(default_factory=list)
    consumers: dict[Hashable, ModelConsumer] = field(default_factory=dict)
    unacked: dict[Hashable, list[ModelMessage]] = field(default_factory=dict)
    ring: list[Hashable] = field(default_factory=list)
    publishers: list[tuple[Hashable, int]] = field(default_factory=list)  # least recently used first
    dead_letter_seq: int = 0  # the latest DeadLetter's sequence

    # --- helpers ----------------------------------------------------------------------------------------------

    def level(self, m: ModelMessage) -> int:
        top = self.args.max_priority or 0
        return min(max(m.message.priority, 0), top)

    def ordered_ready(self) -> list[ModelMessage]:
        return sorted(self.ready, key=lambda m: (-self.level(m), m.msg_id))

    def lose(self, m: ModelMessage, reason: str, out: list[QueueEffect]) -> None:
        if self.args.dead_letter_exchange is not None:
            self.dead_letter_seq += 1
            out.append(DeadLetter(m.message, reason, m.delivery_count, MsgId(m.msg_id),  # type: ignore[arg-type]
                                  seq=self.dead_letter_seq))
        else:
            out.append(Dropped(MsgId(m.msg_id), reason))  # type: ignore[arg-type]

    def advance(self, now_ms: int, out: list[QueueEffect]) -> None:
        self.now_ms = max(self.now_ms, now_ms)
        self.expire_due(out)

    def expire_due(self, out: list[QueueEffect]) -> None:
        due = [m for m in self.ready if m.expiry_ms is not None and m.expiry_ms <= self.now_ms]
        for m in sorted(due, key=lambda m: (m.expiry_ms, m.msg_id)):
            self.ready.remove(m)
            self.lose(m, "expired", out)

    def has_capacity(self, c: ModelConsumer) -> bool:
        if c.credit is not None and c.credit <= 0:
            return False
        return c.prefetch <= 0 or c.no_ack or len(self.unacked.get(c.consumer_id, [])) < c.prefetch

    def offer(self, consumer_id: Hashable) -> None:
        c = self.consumers.get(consumer_id)
        if c is not None and consumer_id not in self.ring and self.has_capacity(c):
            self.ring.append(consumer_id)

    def take_ready(self, out: list[QueueEffect]) -> ModelMessage | None:
        while self.ready:
            m = self.ordered_ready()[0]
            self.ready.remove(m)
            if m.expiry_ms is None or m.expiry_ms >= self.now_ms:
                return m
            self.lose(m, "expired", out)
        return None

    def deliver(self, out: list[QueueEffect]) -> None:
        while self.ready:
            if not self.ring:
                return
            top = max(self.consumers[cid].priority for cid in self.ring)
            cid = next(cid for cid in self.ring if self.consumers[cid].priority == top)
            c = self.consumers[cid]
            m = self.take_ready(out)
            if m is None:
                return
            if c.credit is not None:
                c.credit -= 1
            out.append(Deliver(cid, MsgId(m.msg_id), m.message, m.redelivered, m.delivery_count))
            if not c.no_ack:
                self.unacked.setdefault(cid, []).append(m)
            self.ring.remove(cid)
            if self.has_capacity(c):
                self.ring.append(cid)

    def requeue(self, m: ModelMessage, out: list[QueueEffect]) -> None:
        m.delivery_count += 1
        m.redelivered = True
        limit = self.args.delivery_limit
        if limit is not None and m.delivery_count > limit:
            self.lose(m, "delivery_limit", out)
        else:
            self.ready.append(m)

    def take_unacked(self, consumer_id: Hashable, msg_ids: list[MsgId]) -> list[ModelMessage]:
        held = self.unacked.get(consumer_id, [])
        taken = []
        for msg_id in msg_ids:
            for m in held:
                if m.msg_id == msg_id:
                    held.remove(m)
                    taken.append(m)
                    break
        return taken

    def over_limit(self) -> bool:
        count = len(self.ready)
        size = sum(m.message.size_bytes for m in self.ready)
        a = self.args
        return (a.max_length is not None and count > a.max_length) or (
            a.max_length_bytes is not None and size > a.max_length_bytes
        )

    # --- commands ---------------------------------------------------------------------------------------------

    def apply(self, cmd: QueueCommand) -> list[QueueEffect]:
        out: list[QueueEffect] = []
        getattr(self, "on_" + type(cmd).__name__.lower())(cmd, out)
        return out

    def on_enqueue(self, cmd: Enqueue, out: list[QueueEffect]) -> None:
        self.advance(cmd.now_ms, out)
        pid, seq = cmd.publisher_id, cmd.sequence
        tracked = pid is not None and seq is not None
        highs = dict(self.publishers)
        if tracked and pid in highs and seq <= highs[pid]:  # type: ignore[operator]
            out.append(Duplicate(pid, seq))  # type: ignore[arg-type]
            return
        a = self.args
        m_size = cmd.message.size_bytes
        would_overflow = (a.max_length is not None and len(self.ready) + 1 > a.max_length) or (
            a.max_length_bytes is not None
            and sum(m.message.size_bytes for m in self.ready) + m_size > a.max_length_bytes
        )
        if a.overflow != "drop-head" and would_overflow:
            out.append(Rejected(pid, seq, "maxlen"))
            if a.overflow == "reject-publish-dlx" and a.dead_letter_exchange is not None:
                self.dead_letter_seq += 1
                out.append(DeadLetter(cmd.message, "maxlen", 0, seq=self.dead_letter_seq))
            return
        if tracked:
            self.publishers = [(p, s) for p, s in self.publishers if p != pid]
            if len(self.publishers) >= self.publishers_max:
                self.publishers.pop(0)
            self.publishers.append((pid, seq))  # type: ignore[arg-type]
        ttls = [t for t in (a.message_ttl_ms, cmd.message.ttl_ms) if t is not None]
        expiry = self.now_ms + min(ttls) if ttls else None
        m = ModelMessage(self.next_id, cmd.message, expiry)
        self.next_id += 1
        self.ready.append(m)
        out.append(Accepted(pid, seq, MsgId(m.msg_id)))
        self.deliver(out)
        if expiry is not None and expiry <= self.now_ms:
            self.expire_due(out)
        while self.ready and self.over_limit():
            head = self.ordered_ready()[0]
            self.ready.remove(head)
            self.lose(head, "maxlen", out)

    def on_attach(self, cmd: Attach, out: list[QueueEffect]) -> None:
        self.advance(cmd.now_ms, out)
        cid = cmd.consumer_id
        self.consumers[cid] = ModelConsumer(cid, cmd.prefetch, cmd.credit, cmd.priority, cmd.no_ack)
        if cid in self.ring:
            self.ring.remove(cid)
        self.offer(cid)
        self.deliver(out)

    def on_detach(self, cmd: Detach, out: list[QueueEffect]) -> None:
        self.advance(cmd.now_ms, out)
        cid = cmd.consumer_id
        if cid not in self.consumers and cid not in self.unacked:
            return
        self.consumers.pop(cid, None)
        if cid in self.ring:
            self.ring.remove(cid)
        for m in sorted(self.unacked.pop(cid, []), key=lambda m: m.msg_id):
            self.requeue(m, out)
        self.expire_due(out)
        self.deliver(out)

    def on_addcredit(self, cmd: AddCredit, out: list[QueueEffect]) -> None:
        c = self.consumers.get(cmd.consumer_id)
        if c is None or c.credit is None:
            return
        c.credit += cmd.credit
        self.offer(c.consumer_id)
        self.deliver(out)

    def on_settle(self, cmd: Settle, out: list[QueueEffect]) -> None:
        self.take_unacked(cmd.consumer_id, list(cmd.msg_ids))
        self.after_shrink(cmd.consumer_id, out)

    def on_return(self, cmd: Return, out: list[QueueEffect]) -> None:
        self.advance(cmd.now_ms, out)
        for m in self.take_unacked(cmd.consumer_id, list(cmd.msg_ids)):
            self.requeue(m, out)
        self.expire_due(out)
        self.after_shrink(cmd.consumer_id, out)

    def on_discard(self, cmd: Discard, out: list[QueueEffect]) -> None:
        self.advance(cmd.now_ms, out)
        for m in self.take_unacked(cmd.consumer_id, list(cmd.msg_ids)):
            self.lose(m, "rejected", out)
        self.after_shrink(cmd.consumer_id, out)

    def after_shrink(self, consumer_id: Hashable, out: list[QueueEffect]) -> None:
        if consumer_id in self.consumers:
            self.offer(consumer_id)
            self.deliver(out)

    def on_get(self, cmd: Get, out: list[QueueEffect]) -> None:
        self.advance(cmd.now_ms, out)
        m = self.take_ready(out)
        if m is None:
            out.append(GetEmpty(cmd.consumer_id))
            return
        if not cmd.no_ack:
            self.unacked.setdefault(cmd.consumer_id, []).append(m)
        out.append(
            GetOk(
                cmd.consumer_id, MsgId(m.msg_id), m.message, m.redelivered, m.delivery_count, len(self.ready)
            )
        )

    def on_expire(self, cmd: Expire, out: list[QueueEffect]) -> None:
        self.advance(cmd.now_ms, out)

    def on_purge(self, cmd: Purge, out: list[QueueEffect]) -> None:
        out.append(Purged(len(self.ready)))
        self.ready.clear()

    # --- observations -----------------------------------------------------------------------------------------

    def ready_ids(self) -> list[int]:
        return [m.msg_id for m in self.ordered_ready()]

    def unacked_count(self) -> int:
        return sum(len(v) for v in self.unacked.values())

    def next_expiry_ms(self) -> int | None:
        expiries = [m.expiry_ms for m in self.ready if m.expiry_ms is not None]
        return min(expiries) if expiries else None
