"""Node-to-node transport over trio TCP: one connection per pair of nodes, every frame encrypted and authenticated.

One TCP connection per pair of nodes carries every group's traffic in both directions. Only the node with the
smaller id dials (`dials(peer)`); the other side only accepts. The handshake is the shared one of
cluster/authlink/handshake.py (`RAFT_LINK`): both sides prove the cluster secret. The listener refuses an unknown
id, a wrong proof, or a peer that should be dialled *by* it (id not smaller); the dialer refuses a listener that is
not the peer it dialled. After the handshake each side runs a reader and a writer on the connection. Frames: a
4-byte big-endian length, then a sequence number and the `encode_batch` bytes encrypted and authenticated with
AES-256-GCM under per-connection, per-direction keys (cluster/authlink/frames.py; at most `FRAME_BYTES_MAX`). A
frame whose tag does not match (forged or altered: `frames_forged`) or whose sequence number is not the next
(replayed or reordered: `frames_replayed`) is dropped, logged and counted, and closes the connection; so do a
larger frame, an undecodable one, or a batch whose source is not the authenticated peer.
A connection silent for `idle_timeout_s` (up to `IDLE_DEADLINE_STEP_S` more) is closed (every node sends each peer
a NodeBatch at least every `node_heartbeat_ticks`, so silence means a dead link), and so is one whose write does not
finish in that time. A received frame is opened and handed over in the reader task itself (`on_batch` queues it for
the Raft loop). Sending: while the peer's writer waits on its empty queue, `send` writes the frame to the
non-blocking socket itself (`_write_now`: no task hop); otherwise the frame is queued and the writer writes
everything queued by then in one `send_all`, after the rest of a direct write the socket did not take.

On loss the dialer redials with exponential backoff (50 ms doubling to 2 s, reset once a handshake succeeds); the
listener just waits. A newly authenticated connection from a peer replaces the one we hold for it (the newest wins:
the dialer redials only after it gave up on the old one, so the old one is dead or dying).

Frames of the second kind (`Forward`: commands a follower hands to its group's leader, see codec.py) share the
connection and the queue; a forward whose source is not the peer closes the connection like a batch would, and a
map frame of a kind this version does not know is counted and ignored (a newer peer must not be cut off by it).

Outgoing batches wait in one channel per peer of `queue_batches_max`, whichever connection is current; when it is
full, `send` drops the batch (Raft retransmits; a slow or absent peer must not grow our memory).

Refusals (fast detection of a dead peer, docs/cluster.md "Liveness"): a peer whose process is gone refuses TCP
connections (ECONNREFUSED), while a paused or partitioned one does not (connects hang, time out, or complete at the
kernel and then stall in the handshake). After the link to a peer drops, the dialer's redials, and on the listener
side a probe loop (a bare TCP connect, closed at once, with the dialer's backoff, until the peer dials us again),
feed a `RefusalTracker`: `refusing_peers()` are those whose link was lost and whose last `REFUSALS_MIN` connection
attempts, spanning at least `REFUSAL_SPAN_MS_MIN`, were all refused. Any attempt that is not refused resets the
count; a new connection clears the state. A peer never connected since we started is never reported refusing.
The first redial (or probe) after a lost link is made at once, and every refused attempt at a lost peer is also
reported to `on_refused(peer)` right away: the Raft node uses the first one to let the groups that peer led elect
a new leader at once (a refusal is cheap evidence for that: a wrong one only starts a pre-vote that the voters still
hearing the leader ignore), while node-down (`refusing_peers()`) waits for the stricter rule above.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import trio

from cluster.authlink.frames import FrameAuthError, FrameOpener, FrameReplayed, FrameSealer, SessionKeys
from cluster.authlink.handshake import (
    RAFT_LINK,
    FrameError,
    FrameReader,
    HandshakeRefused,
    accept_link,
    dial_link,
)
from cluster.raft.core.multiraft import NodeBatch
from cluster.raft.core.types import NodeId
from cluster.raft.runtime.codec import CodecError, Forward, decode_frame, encode_batch, encode_forward
from cluster.raft.runtime.timing import StageTimings

FRAME_BYTES_MAX = 64 * 1024 * 1024
IDLE_TIMEOUT_S = 30.0
IDLE_DEADLINE_STEP_S = 1.0  # the read side's idle deadline is moved on at most this often (up to 1 s late)
BACKOFF_S_MIN = 0.05
BACKOFF_S_MAX = 2.0
WRITE_COALESCE_MAX = 256
REFUSALS_MIN = 2  # consecutive refused connection attempts after a lost link that make a peer "refusing"
REFUSAL_SPAN_MS_MIN = 200  # ... and how far apart the first and last of them must be at least
PROBE_CONNECT_TIMEOUT_S = 2.0
log = logging.getLogger(__name__)


_LINK_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, FrameError, CodecError,
                OSError)


@dataclass
class TransportStats:
    batches_sent: int = 0
    frames_queued: int = 0  # batches and forwards queued for a peer (not dropped)
    batches_received: int = 0
    batches_dropped: int = 0
    forwards_sent: int = 0  # forward frames queued for a peer
    forwards_received: int = 0
    frames_ignored: int = 0  # frames of a kind this version does not know
    auth_failures: int = 0
    frames_forged: int = 0  # frames after the handshake with a bad tag (forged or altered); each closed its connection
    frames_replayed: int = 0  # ... with a good tag but an unexpected sequence number (replayed or reordered)
    connections_dialed: int = 0  # handshakes completed as the dialer
    connections_accepted: int = 0  # handshakes completed as the listener
    connections_replaced: int = 0  # an older connection from the same peer closed in favour of a new one
    connections_closed: int = 0
    received_from: dict[NodeId, int] = field(default_factory=dict)  # batches per peer


@dataclass(slots=True)
class RefusalTracker:
    """Which lost peers refuse connections now (pure: time is an argument). Fed by the dialer and the prober."""

    refusals_min: int = REFUSALS_MIN
    span_ms_min: int = REFUSAL_SPAN_MS_MIN
    _lost: set[NodeId] = field(default_factory=set)  # the link was up once and is down now
    _refused_ms: dict[NodeId, tuple[int, int, int]] = field(default_factory=dict)  # (count, first_ms, last_ms)

    def connected(self, peer: NodeId) -> None:
        self._lost.discard(peer)
        self._refused_ms.pop(peer, None)

    def lost(self, peer: NodeId) -> None:
        self._lost.add(peer)
        self._refused_ms.pop(peer, None)

    def forget(self, peer: NodeId) -> None:
        self.connected(peer)

    def is_lost(self, peer: NodeId) -> bool:
        return peer in self._lost

    def attempt(self, peer: NodeId, refused: bool, now_ms: int) -> None:
        """One connection attempt to `peer`: refused (ECONNREFUSED), or anything else (connected, timed out...)."""
        if not refused:
            self._refused_ms.pop(peer, None)
            return
        count, first_ms, _ = self._refused_ms.get(peer, (0, now_ms, now_ms))
        self._refused_ms[peer] = (count + 1, first_ms, now_ms)

    def is_refusing(self, peer: NodeId) -> bool:
        if peer not in self._lost or peer not in self._refused_ms:
            return False
        count, first_ms, last_ms = self._refused_ms[peer]
        return count >= self.refusals_min and last_ms - first_ms >= self.span_ms_min

    def refusing(self) -> frozenset[NodeId]:
        return frozenset(peer for peer in self._lost if self.is_refusing(peer))


def is_refusal(error: BaseException) -> bool:
    """True if a failed connect was refused by the peer's host (every address tried answered ECONNREFUSED)."""
    if isinstance(error, ConnectionRefusedError):
        return True
    cause = error.__cause__
    if isinstance(cause, BaseExceptionGroup):
        return all(is_refusal(inner) for inner in cause.exceptions)
    return False


def _now_ms() -> int:
    return int(trio.current_time() * 1000)


@dataclass(eq=False)
class _Connection:
    peer: NodeId
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    fd: int = -1  # the socket's descriptor (direct writes)
    sealer: FrameSealer | None = None
    writer_idle: bool = False  # the writer is blocked on an empty queue: `send` may write itself
    unsent: bytes = b""  # what the socket did not take of a direct write; the writer sends it before anything else


class Transport:
    def __init__(
        self,
        node_id: NodeId,
        peers: dict[NodeId, tuple[str, int]],
        secret: bytes,
        on_batch: Callable[[NodeBatch], None],
        queue_batches_max: int = 1024,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        on_forward: Callable[[Forward], None] | None = None,
        on_refused: Callable[[NodeId], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self.peers = peers
        self._secret = secret
        self._on_batch = on_batch
        self._on_forward = on_forward
        self._on_refused = on_refused
        self._idle_timeout_s = idle_timeout_s
        self._queue_batches_max = queue_batches_max
        self.stats = TransportStats()
        self._channels: dict[NodeId, tuple[trio.MemorySendChannel[bytes], trio.MemoryReceiveChannel[bytes]]] = {
            peer: trio.open_memory_channel[bytes](queue_batches_max) for peer in peers
        }
        self._current: dict[NodeId, _Connection] = {}
        self.refusals = RefusalTracker()
        self._probing: set[NodeId] = set()
        self._nursery: trio.Nursery | None = None
        self.timing: StageTimings | None = None  # RAFTMQ_RAFT_TIMING only: `frame_queue_to_write` (timing.py)
        self._queued_s: dict[NodeId, deque[float]] = {}  # when each queued frame was queued (only when timing)

    def dials(self, peer: NodeId) -> bool:
        """True if this node opens the pair's connection (the smaller id dials)."""
        return self.node_id < peer

    def connected_peers(self) -> frozenset[NodeId]:
        return frozenset(self._current)

    def add_peer(self, peer: NodeId, address: tuple[str, int]) -> None:
        """Learn a peer (or its new address) while running. The caller runs `dial_forever(peer)` if `dials(peer)`."""
        self.peers[peer] = address
        if peer not in self._channels:
            self._channels[peer] = trio.open_memory_channel[bytes](self._queue_batches_max)

    def remove_peer(self, peer: NodeId) -> None:
        """Forget a peer: its inbound connections are refused from now on and ours is closed (its queue stays: a
        connection being torn down may still read it). The caller cancels the dial loop it runs for it."""
        self.peers.pop(peer, None)
        self.refusals.forget(peer)
        self.abort(peer)

    def refusing_peers(self) -> frozenset[NodeId]:
        """Peers whose link was lost and which now refuse connections: their process is gone (see the header)."""
        return self.refusals.refusing()

    def abort(self, peer: NodeId) -> bool:
        """Close the current connection to `peer` (tests, operators); the dialer side reconnects."""
        connection = self._current.get(peer)
        if connection is None:
            return False
        connection.scope.cancel()
        return True

    def send(self, batch: NodeBatch) -> None:
        """Write a batch to its peer's connection now, or queue it; drop it if the peer's queue is full (never
        blocks)."""
        channel = self._channels.get(batch.dst)
        if channel is None:
            return
        payload = encode_batch(batch)
        if self._write_now(batch.dst, payload):
            return
        try:
            channel[0].send_nowait(payload)
        except trio.WouldBlock:
            self.stats.batches_dropped += 1
            return
        self.stats.frames_queued += 1
        if self.timing is not None:
            self._queued_s.setdefault(batch.dst, deque()).append(self.timing.now_s())

    def send_forward(self, forward: Forward) -> bool:
        """Queue forwarded commands for their peer (the same bounded queue as batches); False: dropped."""
        channel = self._channels.get(forward.dst)
        if channel is None:
            return False
        payload = encode_forward(forward)
        if self._write_now(forward.dst, payload):
            self.stats.forwards_sent += 1
            return True
        try:
            channel[0].send_nowait(payload)
        except trio.WouldBlock:
            self.stats.batches_dropped += 1
            return False
        self.stats.frames_queued += 1
        if self.timing is not None:
            self._queued_s.setdefault(forward.dst, deque()).append(self.timing.now_s())
        self.stats.forwards_sent += 1
        return True

    def _write_now(self, peer: NodeId, payload: bytes) -> bool:
        """Direct write: while the peer's writer waits on an empty queue (nothing of ours is queued or being
        written), seal the frame and hand it to the non-blocking socket at once, from the caller's task (no task
        hop: the frame leaves before the Raft loop's turn goes on). What the socket does not take is left to the
        writer (`unsent`, woken by an empty marker in the queue), which sends it before anything queued after it,
        so frames keep their order. False: not written (the caller queues the payload)."""
        connection = self._current.get(peer)
        if connection is None or not connection.writer_idle or connection.unsent or connection.sealer is None:
            return False
        frame = connection.sealer.seal(payload)
        try:
            written = os.write(connection.fd, frame)
        except BlockingIOError:
            written = 0
        except OSError as error:
            log.debug("connection with %s lost (direct write): %r", peer, error)
            connection.scope.cancel()
            self.stats.batches_dropped += 1
            return True  # the frame is lost with the link (Raft retransmits); nothing more to queue
        self.stats.batches_sent += 1
        if written < len(frame):
            connection.unsent = frame[written:]
            self._channels[peer][0].send_nowait(b"")  # the writer is blocked on the empty queue: wake it
        if self.timing is not None:
            self.timing.record("frame_queue_to_write", 0.0)
            self.timing.event("wrote", f"{self.node_id}>{peer}", connection.sealer.seq - 1)
        return True

    async def serve(self, host: str, port: int, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(trio.serve_tcp, self._handle_inbound, port, host=host))
            self._nursery = nursery
            for peer in sorted(self.peers):
                if self.dials(peer):
                    nursery.start_soon(self.dial_forever, peer)
            task_status.started()

    # --- listener side ---------------------------------------------------------------------------------------

    async def _handle_inbound(self, stream: trio.SocketStream) -> None:
        async with stream:
            reader = FrameReader(stream)
            try:
                accepted = await accept_link(RAFT_LINK, self._secret, self.node_id, stream, reader, self._admits)
            except HandshakeRefused as refusal:
                self.stats.auth_failures += 1
                log.info("inbound connection refused: %s", refusal)
                return
            if accepted is None:
                return  # closed before finishing (e.g. a peer's refusal probe): not an auth failure
            peer, keys = accepted
            self.stats.connections_accepted += 1
            await self._carry(NodeId(peer), stream, reader, keys)

    def _admits(self, node_id: str) -> bool:
        """A known peer that dials us (its id is smaller: one connection per pair)."""
        return node_id in self.peers and node_id < self.node_id

    # --- dialer side -----------------------------------------------------------------------------------------

    async def dial_forever(self, peer: NodeId) -> None:
        """Keep a connection to `peer` (which this node dials), redialing with backoff; runs until cancelled."""
        host, port = self.peers[peer]
        backoff_s = BACKOFF_S_MIN
        while True:
            try:
                stream = await trio.open_tcp_stream(host, port)
            except OSError as error:
                log.debug("dial %s failed: %r", peer, error)
                self._attempted(peer, is_refusal(error))
            else:
                self._attempted(peer, False)
                async with stream:
                    reader = FrameReader(stream)
                    keys = await self._dialer_handshake(peer, stream, reader)
                    if keys is not None:
                        backoff_s = BACKOFF_S_MIN
                        self.stats.connections_dialed += 1
                        carried_since = trio.current_time()
                        await self._carry(peer, stream, reader, keys)
                        if trio.current_time() - carried_since >= BACKOFF_S_MAX:
                            continue  # a healthy link was lost: the first redial at once (is the peer gone?)
            await trio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, BACKOFF_S_MAX)

    def _attempted(self, peer: NodeId, refused: bool) -> None:
        """Record a connection attempt at `peer`; a refused one at a lost peer is reported to `on_refused` too."""
        self.refusals.attempt(peer, refused, _now_ms())
        if refused and self._on_refused is not None and self.refusals.is_lost(peer):
            self._on_refused(peer)

    async def _dialer_handshake(self, peer: NodeId, stream: trio.SocketStream,
                                reader: FrameReader) -> SessionKeys | None:
        """The connection's frame keys once the listener proved the secret; None if the handshake failed."""
        try:
            return await dial_link(RAFT_LINK, self._secret, self.node_id, peer, stream, reader)
        except HandshakeRefused as refusal:
            self.stats.auth_failures += 1
            log.info("connection to %s refused: %s", peer, refusal)
            return None

    # --- an authenticated connection, either side ------------------------------------------------------------

    async def _carry(self, peer: NodeId, stream: trio.SocketStream, reader: FrameReader, keys: SessionKeys) -> None:
        """Carry traffic both ways until the link fails or a newer connection from the peer replaces this one."""
        connection = _Connection(peer)
        older = self._current.get(peer)
        if older is not None:
            older.scope.cancel()
            self.stats.connections_replaced += 1
        self._current[peer] = connection
        self.refusals.connected(peer)
        try:
            with connection.scope:
                async with trio.open_nursery() as nursery:
                    connection.fd = stream.socket.fileno()
                    connection.sealer = FrameSealer(keys.send)
                    nursery.start_soon(self._write_loop, connection, stream, nursery.cancel_scope)
                    await self._read_loop(peer, reader, FrameOpener(keys.receive))
                    nursery.cancel_scope.cancel()
        finally:
            if self._current.get(peer) is connection:
                del self._current[peer]
                self._link_lost(peer)
            self.stats.connections_closed += 1

    def _link_lost(self, peer: NodeId) -> None:
        """Start watching for refusals: the dialer's redials do it on that side; the listener probes."""
        if peer not in self.peers:
            return  # removed (remove_peer): nothing to watch
        self.refusals.lost(peer)
        if not self.dials(peer) and peer not in self._probing and self._nursery is not None:
            try:
                self._nursery.start_soon(self._probe_until_back, peer)
            except RuntimeError:  # the transport has stopped
                return
            self._probing.add(peer)

    async def _probe_until_back(self, peer: NodeId) -> None:
        """Listener side: connect to the lost peer's port (and close at once) with the dialer's backoff, recording
        refusals, until it dials us again or is no longer a peer."""
        backoff_s = 0.0  # the first probe at once
        try:
            while True:
                await trio.sleep(backoff_s)
                backoff_s = min(max(backoff_s * 2, BACKOFF_S_MIN), BACKOFF_S_MAX)
                address = self.peers.get(peer)
                if address is None or peer in self._current:
                    return
                refused = False
                with trio.move_on_after(PROBE_CONNECT_TIMEOUT_S):
                    try:
                        probe = await trio.open_tcp_stream(*address)
                    except OSError as error:
                        refused = is_refusal(error)
                    else:
                        await probe.aclose()
                if peer in self._current:
                    return  # it dialed us meanwhile: the connection is proof of life
                self._attempted(peer, refused)
        finally:
            self._probing.discard(peer)

    async def _read_loop(self, peer: NodeId, reader: FrameReader, opener: FrameOpener) -> None:
        """Read, open and hand over frames until the link fails. One idle-timeout scope for the connection, its
        deadline moved on at most every `IDLE_DEADLINE_STEP_S` (not a new scope per frame: a frame's cost counts
        at a low rate, where every message is its own Raft round)."""
        try:
            with trio.CancelScope() as idle:
                moved_s = trio.current_time()
                idle.deadline = moved_s + self._idle_timeout_s
                while True:
                    body = await reader.read(FRAME_BYTES_MAX)
                    if body is None:
                        return
                    now_s = trio.current_time()
                    if now_s - moved_s >= IDLE_DEADLINE_STEP_S:
                        moved_s = now_s
                        idle.deadline = now_s + self._idle_timeout_s
                    if self.timing is not None:
                        self.timing.event("read", f"{peer}>{self.node_id}", opener.expected)
                    self._deliver(peer, decode_frame(opener.open(body)))
            if idle.cancelled_caught:
                log.debug("connection with %s lost (read): silent for %.0f s", peer, self._idle_timeout_s)
        except FrameAuthError as error:
            if isinstance(error, FrameReplayed):
                self.stats.frames_replayed += 1
            else:
                self.stats.frames_forged += 1
            log.warning("connection with %s: frame dropped and connection closed: %s", peer, error)
        except _LINK_ERRORS as error:
            log.debug("connection with %s lost (read): %r", peer, error)

    def _deliver(self, peer: NodeId, decoded: NodeBatch | Forward | None) -> None:
        if decoded is None:
            self.stats.frames_ignored += 1
            return
        if decoded.src != peer or decoded.dst != self.node_id:
            raise FrameError(f"frame {decoded.src}->{decoded.dst} on {peer}'s connection")
        self.stats.received_from[peer] = self.stats.received_from.get(peer, 0) + 1
        if isinstance(decoded, Forward):
            self.stats.forwards_received += 1
            if self._on_forward is not None:
                self._on_forward(decoded)
            return
        self.stats.batches_received += 1
        self._on_batch(decoded)

    def _written(self, peer: NodeId, frames: int, timing: StageTimings) -> None:
        queued = self._queued_s.get(peer)
        for _ in range(frames):
            if queued:
                timing.since("frame_queue_to_write", queued.popleft())

    async def _write_loop(self, connection: _Connection, stream: trio.SocketStream, scope: trio.CancelScope) -> None:
        """Write the queued frames (and the rest of a direct write: `_write_now`), coalescing what is queued."""
        peer = connection.peer
        receive = self._channels[peer][1]
        assert connection.sealer is not None
        sealer = connection.sealer
        seal = sealer.seal
        try:
            while True:
                try:
                    payload = receive.receive_nowait()
                except trio.WouldBlock:
                    connection.writer_idle = True  # only while blocked here: `send` writes directly meanwhile
                    try:
                        payload = await receive.receive()
                    finally:
                        connection.writer_idle = False
                unsent, connection.unsent = connection.unsent, b""
                chunks = [seal(payload)] if payload else []  # (empty: the marker that wakes us for `unsent`)
                while len(chunks) < WRITE_COALESCE_MAX:  # coalesce what is already queued into one write
                    try:
                        payload = receive.receive_nowait()
                    except trio.WouldBlock:
                        break
                    if payload:
                        chunks.append(seal(payload))
                if not chunks and not unsent:
                    continue
                # Shielded: a replacement or abort never leaves half a frame on the wire; but bounded, so a peer
                # that stops reading cannot hold the writer forever (the connection is closed after a timeout).
                with trio.CancelScope(shield=True, deadline=trio.current_time() + self._idle_timeout_s) as write:
                    await stream.send_all(b"".join([unsent, *chunks]) if unsent else b"".join(chunks))
                if write.cancelled_caught:
                    raise trio.TooSlowError
                self.stats.batches_sent += len(chunks)
                if self.timing is not None:
                    self._written(peer, len(chunks), self.timing)
                    self.timing.event("wrote", f"{self.node_id}>{peer}", sealer.seq - 1)
        except _LINK_ERRORS as error:
            log.debug("connection with %s lost (write): %r", peer, error)
        scope.cancel()
