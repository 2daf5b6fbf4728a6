"""One replica of a mirrored queue: its log, LEO, flushed prefix, HW (and its checkpoint) and leader-epoch cache.

A replica is a leader or a follower as the controller says (`become_leader`, `become_follower`). The leader
appends publishes in its epoch, answers fetches, tracks each follower's LEO and when it last caught up, shrinks
the ISR of followers behind for more than `replica_lag_max_ms` and expands it when they catch up (except those the
host says are `held_out`: unsynchronised mirrors under ha-sync-mode manual), and moves the HW
to the smallest LEO in the ISR while the ISR has at least `min_insync` members; a publish is confirmed when the HW
passes it. A follower first finds where its log agrees with the leader's (`Settings.truncation`), then fetches
from its LEO; it learns the HW from the fetch replies. Every method takes `now_ms` where time matters and returns
effects. `crash_image()` is what a crash leaves (the snapshot, the flushed log, the epoch cache, the HW
checkpoint) and `Replica.recover` restarts from it.

Bounding the log: the host calls `trim(offset, data)` with its state machine after applying every record below
`offset` (at most the HW, so only committed records go): the records below become a `Snapshot` and the log starts
at `offset` (`log_start`; `log[i]` is the record at offset `log_start + i`). The epoch cache keeps the entries for
offsets at or above the log start, the first one being the snapshot's epoch from the log start on (Kafka's
`truncateFromStart`). A follower whose fetch offset is below the leader's log start gets the snapshot with the
records after it and installs it (`SnapshotInstalled`); one whose latest epoch is older than anything in the
leader's cache gets no common epoch and truncates to 0 (its own snapshot too: what it holds below the leader's
log start may diverge after the end of that old epoch), then fetches the snapshot. A truncation below the log
start (only that case, an unclean leader or the unsafe `hw` mode) empties the replica the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cluster.mirror_queues.core.types import (
    Confirmed,
    Effect,
    EpochEndRequest,
    EpochEndResponse,
    FetchRequest,
    FetchResponse,
    IsrChanged,
    Message,
    Nacked,
    Record,
    Send,
    Settings,
    Snapshot,
    SnapshotInstalled,
    Truncated,
)

Role = Literal["leader", "follower", "none"]


@dataclass(frozen=True, slots=True)
class DurableImage:
    log: tuple[Record, ...]
    epochs: tuple[tuple[int, int], ...]  # (epoch, start offset); written through on every change
    hw_checkpoint: int
    snapshot: Snapshot | None = None  # the records below the log start (= snapshot.offset; 0 without one)


class Replica:
    def __init__(self, name: str, settings: Settings, now_ms: int = 0) -> None:
        self.name = name
        self.settings = settings
        self.log: list[Record] = []  # the records from log_start on
        self.log_start = 0
        self.snapshot: Snapshot | None = None  # the state below log_start (None while log_start is 0)
        self.flushed = 0  # the log's durable prefix (an offset; everything below log_start is durable)
        self.epochs: list[tuple[int, int]] = []
        self.hw = 0
        self.hw_checkpoint = 0
        self.last_checkpoint_ms = now_ms
        self.role: Role = "none"
        self.leader: str | None = None
        self.epoch = -1  # the leader epoch this replica follows or leads
        self.truncating = False
        self.asked_epoch = -1
        # leader state
        self.isr: set[str] = set()
        self.follower_leo: dict[str, int] = {}
        self.last_caught_up: dict[str, int] = {}
        self.pending: dict[int, str] = {}
        # replicas the controller holds out of the ISR (ha-sync-mode manual, not synchronised yet): the host sets
        # it from the committed record, as `settings.min_insync`; a caught-up fetch of theirs does not expand the ISR
        self.held_out: frozenset[str] = frozenset()

    # --- log ---------------------------------------------------------------------------------------------------

    @property
    def leo(self) -> int:
        return self.log_start + len(self.log)

    def records(self, start: int, end: int) -> list[Record]:
        """The records at offsets [start, end) that the log still holds (from the log start on)."""
        return self.log[max(start - self.log_start, 0):max(end - self.log_start, 0)]

    def _base_epochs(self) -> list[tuple[int, int]]:
        return [(self.snapshot.epoch, self.log_start)] if self.snapshot is not None else []

    def latest_epoch(self) -> int:
        return self.epochs[-1][0] if self.epochs else -1

    def _append(self, record: Record) -> None:
        self.log.append(record)
        if record.epoch > self.latest_epoch():
            self.epochs.append((record.epoch, record.offset))
        if self.settings.flush == "fsync":
            self.flushed = self.leo

    def flush(self) -> None:
        """The host wrote the page cache back (an fsync, or the OS's writeback)."""
        self.flushed = self.leo

    def _truncate(self, to: int, how: str) -> list[Effect]:
        if to >= self.leo:
            return []
        before = self.leo
        if to < self.log_start:  # below the snapshot: nothing here can be trusted, start empty
            self.log_start, self.snapshot = 0, None
            to = 0
        del self.log[to - self.log_start:]
        self.flushed = min(self.flushed, to)
        base = self._base_epochs()
        self.epochs = base + [(e, s) for e, s in self.epochs if s < to and (e, s) not in base]
        self.hw = min(self.hw, to)
        return [Truncated(self.name, before, to, how)]

    def trim(self, offset: int, data: str) -> bool:
        """The host's state machine after every record below `offset` (which must be at most the HW): drop those
        records and keep `data` as the snapshot. False (nothing done) if `offset` is not above the log start or
        is beyond the HW."""
        if offset <= self.log_start or offset > self.hw or offset > self.leo:
            return False
        epoch = self.log[offset - 1 - self.log_start].epoch
        self.snapshot = Snapshot(offset, epoch, data)
        del self.log[:offset - self.log_start]
        self.log_start = offset
        self.flushed = max(self.flushed, offset)  # the snapshot is written durably
        self.epochs = [(epoch, offset)] + [(e, s) for e, s in self.epochs if s >= offset and e > epoch]
        return True

    def _install(self, snapshot: Snapshot) -> list[Effect]:
        self.log = []
        self.log_start = snapshot.offset
        self.snapshot = snapshot
        self.flushed = snapshot.offset
        self.epochs = [(snapshot.epoch, snapshot.offset)]
        self.hw = max(self.hw, snapshot.offset)
        return [SnapshotInstalled(self.name, snapshot)]

    def end_offset_for(self, epoch: int) -> tuple[int, int]:
        """(largest epoch <= `epoch` in this cache, the first offset after it); (-1, -1) if there is none."""
        found = -1
        end = -1
        for i, (e, _start) in enumerate(self.epochs):
            if e > epoch:
                break
            found = e
            end = self.epochs[i + 1][1] if i + 1 < len(self.epochs) else self.leo
        return found, end

    def committed(self) -> list[Record]:
        """What a consumer may read: the log below the HW."""
        return self.records(self.log_start, self.hw)

    # --- crash and recovery ------------------------------------------------------------------------------------

    def crash_image(self) -> DurableImage:
        return DurableImage(tuple(self.records(self.log_start, self.flushed)), tuple(self.epochs), self.hw_checkpoint,
                            self.snapshot)

    @classmethod
    def recover(cls, name: str, settings: Settings, image: DurableImage, now_ms: int) -> Replica:
        replica = cls(name, settings, now_ms)
        replica.snapshot = image.snapshot
        replica.log_start = image.snapshot.offset if image.snapshot is not None else 0
        replica.log = list(image.log)
        replica.flushed = replica.leo
        base = replica._base_epochs()
        replica.epochs = base + [(e, s) for e, s in image.epochs
                                 if replica.log_start <= s < replica.leo and (e, s) not in base
                                 and (not base or e > base[0][0])]
        replica.hw_checkpoint = image.hw_checkpoint
        replica.hw = max(replica.log_start, min(image.hw_checkpoint, replica.leo))  # the snapshot was committed
        return replica

    # --- roles -------------------------------------------------------------------------------------------------

    def become_leader(self, epoch: int, isr: frozenset[str], now_ms: int) -> list[Effect]:
        self.role = "leader"
        self.leader = self.name
        self.epoch = epoch
        self.truncating = False
        if self.latest_epoch() < epoch:
            self.epochs.append((epoch, self.leo))  # KIP-279: a new leader records its epoch at its LEO
        self.isr = set(isr) | {self.name}
        self.follower_leo = {}
        self.last_caught_up = {f: now_ms for f in self.isr}
        self.pending = {}
        self.hw = min(self.hw, self.leo)
        return self._advance_hw()

    def become_follower(self, leader: str, epoch: int) -> list[Effect]:
        """Leaving the leader role abandons its pending publishes (the publisher times out and retries)."""
        self.role = "follower"
        self.leader = leader
        self.epoch = epoch
        self.pending = {}
        self.isr = set()
        if self.settings.truncation == "hw":
            self.truncating = False
            return self._truncate(self.hw, "hw (unsafe)")
        self.truncating = bool(self.epochs)
        self.asked_epoch = self.latest_epoch()
        return []

    def update_isr(self, isr: frozenset[str], now_ms: int) -> list[Effect]:
        """The controller changed the ISR itself (an unclean restart dropped a member)."""
        if self.role != "leader":
            return []
        for f in isr - self.isr:
            self.last_caught_up[f] = now_ms
        self.isr = set(isr) | {self.name}
        return self._advance_hw()

    # --- time --------------------------------------------------------------------------------------------------

    def tick(self, now_ms: int) -> list[Effect]:
        effects: list[Effect] = []
        if now_ms - self.last_checkpoint_ms >= self.settings.hw_checkpoint_interval_ms:
            self.hw_checkpoint = self.hw
            self.last_checkpoint_ms = now_ms
        if self.role != "leader":
            return effects
        lag_max = self.settings.replica_lag_max_ms
        lagging = {f for f in self.isr if f != self.name and now_ms - self.last_caught_up.get(f, now_ms) > lag_max}
        if lagging:
            self.isr -= lagging
            effects.append(IsrChanged(self.name, self.epoch, frozenset(self.isr)))
            effects.extend(self._advance_hw())
        if len(self.isr) < self.settings.min_insync:
            effects.extend(Nacked(msg, "isr-below-min") for msg in self.pending.values())
            self.pending.clear()
        return effects

    def poll(self) -> list[Effect]:
        """A follower's next request to its leader: the epoch question while truncating, else a fetch."""
        if self.role != "follower" or self.leader is None:
            return []
        if self.truncating:
            return [Send(self.leader, EpochEndRequest(self.name, self.epoch, self.asked_epoch))]
        return [Send(self.leader, FetchRequest(self.name, self.epoch, self.leo))]

    # --- leader ------------------------------------------------------------------------------------------------

    def publish(self, msg: str) -> list[Effect]:
        if self.role != "leader":
            return [Nacked(msg, "not-leader")]
        if len(self.isr) < self.settings.min_insync:
            return [Nacked(msg, "not-enough-replicas")]
        offset = self.leo
        self._append(Record(offset, self.epoch, msg))
        self.pending[offset] = msg
        return self._advance_hw()

    def _advance_hw(self) -> list[Effect]:
        if self.role != "leader" or len(self.isr) < self.settings.min_insync:
            return []
        candidate = min(self.leo if r == self.name else self.follower_leo.get(r, 0) for r in self.isr)
        if candidate <= self.hw:
            return []
        self.hw = candidate
        done = sorted(o for o in self.pending if o < self.hw)
        return [Confirmed(self.pending.pop(o), o) for o in done]

    def _on_fetch(self, req: FetchRequest, now_ms: int) -> list[Effect]:
        if req.fetch_offset > self.leo:
            return [Send(req.src, FetchResponse(self.name, self.epoch, (), self.hw, True, self.leo))]
        snapshot = self.snapshot if req.fetch_offset < self.log_start else None
        effects: list[Effect] = []
        self.follower_leo[req.src] = req.fetch_offset
        if req.fetch_offset >= self.leo:
            self.last_caught_up[req.src] = now_ms
            if req.src not in self.isr and req.src not in self.held_out:
                self.isr.add(req.src)
                effects.append(IsrChanged(self.name, self.epoch, frozenset(self.isr)))
        effects.extend(self._advance_hw())
        start = max(req.fetch_offset, self.log_start)
        records = tuple(self.records(start, start + self.settings.fetch_max_records))
        effects.append(Send(req.src, FetchResponse(self.name, self.epoch, records, self.hw, False, self.leo,
                                                   snapshot)))
        return effects

    def _on_epoch_end(self, req: EpochEndRequest) -> list[Effect]:
        if self.settings.truncation == "leader-epoch-v0":
            offset = self.leo
            for e, start in self.epochs:  # KIP-101: the start of the first epoch after the requested one
                if e > req.requested_epoch:
                    offset = start
                    break
            return [Send(req.src, EpochEndResponse(self.name, self.epoch, -1, offset))]
        found, end = self.end_offset_for(req.requested_epoch)
        return [Send(req.src, EpochEndResponse(self.name, self.epoch, found, end))]

    # --- follower ----------------------------------------------------------------------------------------------

    def _on_fetch_response(self, resp: FetchResponse) -> list[Effect]:
        if self.truncating:
            return []
        if resp.out_of_range:
            return self._truncate(resp.leader_leo, "out-of-range")
        effects: list[Effect] = []
        if resp.snapshot is not None and resp.snapshot.offset > self.leo:
            effects = self._install(resp.snapshot)
        for record in resp.records:
            if record.offset == self.leo:
                self._append(record)
        self.hw = max(self.log_start, min(resp.leader_hw, self.leo))  # the snapshot is committed
        return effects

    def _on_epoch_end_response(self, resp: EpochEndResponse) -> list[Effect]:
        if not self.truncating:
            return []
        if self.settings.truncation == "leader-epoch-v0":
            self.truncating = False
            return self._truncate(min(resp.end_offset, self.leo), "leader-epoch-v0")
        if resp.end_epoch < 0:  # the leader has nothing from an epoch this old: nothing here is shared
            self.truncating = False
            return self._truncate(0, "leader-epoch")
        mine, my_end = self.end_offset_for(resp.end_epoch)
        if mine == resp.end_epoch:
            self.truncating = False
            return self._truncate(min(resp.end_offset, my_end), "leader-epoch")
        # KIP-279: this replica lacks the leader's epoch; cut back to its own largest earlier epoch and ask again
        earlier = [(e, s) for e, s in self.epochs if e < resp.end_epoch]
        if not earlier:
            self.truncating = False
            return self._truncate(0, "leader-epoch")
        e_prev = earlier[-1][0]
        _, prev_end = self.end_offset_for(e_prev)
        effects = self._truncate(prev_end, "leader-epoch (another round)")
        self.asked_epoch = e_prev
        return effects

    # --- dispatch ----------------------------------------------------------------------------------------------

    def handle(self, message: Message, now_ms: int) -> list[Effect]:
        """A message from another replica; one from another leader epoch is ignored (fenced or stale)."""
        if message.epoch != self.epoch:
            return []
        if isinstance(message, FetchRequest):
            return self._on_fetch(message, now_ms) if self.role == "leader" else []
        if isinstance(message, EpochEndRequest):
            return self._on_epoch_end(message) if self.role == "leader" else []
        if self.role != "follower" or message.src != self.leader:
            return []
        if isinstance(message, FetchResponse):
            return self._on_fetch_response(message)
        return self._on_epoch_end_response(message)
