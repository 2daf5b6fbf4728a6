"""The runtime side of single-node paging (node/broker/paging.py): recovery's index of a long queue stream, the
offsets of paged-out records, and the reads behind `PageIn` effects.

`QueueStreamFold` folds a queue stream at recovery without keeping bodies: message records become two parallel
`array('q')` columns (msg id, offset; 16 bytes a record), and a MessageRemoved record marks the latest earlier
record with its id dead. So does a message record whose id is not above every id seen so far: a persistent message
spilled under the memory alarm is written again as one record with its id (no removal first, so that no crash
point loses it), and that copy is its new place; only the latest record of an id can be live. Within one run of the queue's id counter, ids grow with the offset, so that record is
found by binary search; the counter restarts only after a restart that left no higher id live (or a
re-declare), which starts a new run, searched newest first. The live messages come out in log order, which is
also msg id order (any message live at a restart has a lower id than everything written after it), as one
`MessageIndexRecord`.

`PageReader` is owned by the store: `Store.persist` calls `tail_appended` for every `TailMessageRecord` it
appends; `request` queues a `PageIn`. Its task (`run`) reports the offsets to the broker
(`Broker.on_tail_offsets`) and reads each request's records with `NodeLog.read_at` in a worker thread, handing
them to `Broker.on_paged_in`; the broker keeps at most one request per queue outstanding and each holds at most
`paging.PAGE_IN_BATCH_MAX` offsets, so the reader's queues are bounded by the number of queues.
"""

from __future__ import annotations

import bisect
import logging
from array import array
from typing import Any

import cbor2
import trio

from node.broker.records import MessageIndexRecord, MessageRecord, MessageRemovedRecord, Record, from_cbor

log = logging.getLogger("raftmq.store")

DEAD = -1


class QueueStreamFold:
    """The live messages of one queue stream, as ids and offsets, built one record at a time in log order."""

    __slots__ = ("_id_max", "_ids", "_name", "_offsets", "_others", "_run_starts")

    def __init__(self) -> None:
        self._ids = array("q")
        self._offsets = array("q")
        self._run_starts: list[int] = []  # index where each run of ascending ids starts
        self._id_max = -1  # the highest message id seen so far (a lower one may be a moved message)
        self._name: tuple[str, str] | None = None
        self._others: list[Record] = []

    def add(self, offset: int, record: Record) -> None:
        if isinstance(record, MessageRecord):
            if record.properties.get("delivery_mode") != 2:
                return  # a transient message spilled by paging: never recovered
            ids = self._ids
            if record.msg_id <= self._id_max:
                self._remove(record.msg_id)  # spilled under the alarm: this copy is the message's new place
            else:
                self._id_max = record.msg_id
            if not ids or record.msg_id <= ids[-1]:
                self._run_starts.append(len(ids))
            ids.append(record.msg_id)
            self._offsets.append(offset)
            if self._name is None:
                self._name = (record.vhost, record.queue)
        elif isinstance(record, MessageRemovedRecord):
            self._remove(record.msg_id)
        else:
            self._others.append(record)

    def _remove(self, msg_id: int) -> None:
        ids = self._ids
        end = len(ids)
        for start in reversed(self._run_starts):
            index = bisect.bisect_left(ids, msg_id, start, end)
            if index < end and ids[index] == msg_id:
                self._offsets[index] = DEAD
                return
            end = start

    def records(self) -> list[Record]:
        """The fold's result: one MessageIndexRecord (if the stream named its queue) after any other records."""
        if self._name is None:
            return list(self._others)
        live_ids, live_offsets = array("q"), array("q")
        for msg_id, offset in zip(self._ids, self._offsets, strict=True):
            if offset != DEAD:
                live_ids.append(msg_id)
                live_offsets.append(offset)
        vhost, queue = self._name
        return [*self._others, MessageIndexRecord(vhost, queue, live_ids, live_offsets)]


class PageReader:
    """Offsets of paged-out records to report, and PageIn requests to read (see the module docstring)."""

    def __init__(self, node_log: Any) -> None:
        self.log = node_log
        self.offsets: list[tuple[str, int, int]] = []
        self.requests: list[Any] = []
        self._wake = trio.Event()

    def tail_appended(self, stream: str, msg_id: int, offset: int) -> None:
        self.offsets.append((stream, msg_id, offset))
        self._wake.set()

    def request(self, effect: Any) -> None:
        """A `PageIn` effect (the node's effect sink)."""
        self.requests.append(effect)
        self._wake.set()

    def read(self, stream: str, offsets: tuple[int, ...]) -> list[MessageRecord]:
        """Worker thread: the records at `offsets`, decoded (an unreadable one is logged and left out)."""
        records: list[MessageRecord] = []
        for offset in offsets:
            try:
                record = from_cbor(cbor2.loads(self.log.read_at(stream, offset)))
            except (KeyError, ValueError, cbor2.CBORDecodeError) as exc:
                log.error("paging: cannot read %s at offset %d: %r", stream, offset, exc)
                continue
            if isinstance(record, MessageRecord):
                records.append(record)
        return records

    async def serve_once(self, node: Any) -> None:
        """Report the offsets appended so far, then read and hand over every queued request."""
        broker = node.broker
        if self.offsets:
            offsets, self.offsets = self.offsets, []
            node.dispatch(broker.on_tail_offsets(offsets))
        while self.requests:
            requests, self.requests = self.requests, []
            for effect in requests:
                records = await trio.to_thread.run_sync(self.read, effect.stream, effect.offsets)
                node.dispatch(broker.on_paged_in(effect.vhost, effect.queue, effect.request_id, records))

    async def run(self, node: Any) -> None:
        """Until cancelled: serve whenever something was appended or requested."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            await self.serve_once(node)
