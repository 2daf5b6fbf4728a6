"""The transport writes a frame from the sender's task when the peer's writer is idle (no task hop), and hands what
the socket did not take to the writer: frames still arrive whole and in order, over one connection, when a frame
is far larger than the socket's buffer and more frames follow it at once."""

from __future__ import annotations

import trio

from cluster.raft.core.multiraft import NodeBatch
from cluster.raft.core.types import GroupId, NodeId
from cluster.raft.runtime.codec import Command, Forward
from cluster.raft.runtime.transport import Transport
from tests.raft.test_runtime_cluster import _free_ports

N1, N2 = NodeId("n1"), NodeId("n2")
SECRET = b"direct-write-test-secret-0123456789"
WAIT_S = 30
BIG_BYTES = 8 * 1024 * 1024  # far beyond a loopback socket's send buffer: the direct write is partial


async def test_frames_keep_their_order_when_a_direct_write_is_partial() -> None:
    port_1, port_2 = _free_ports(2)
    received: list[object] = []
    n1 = Transport(N1, {N2: ("127.0.0.1", port_2)}, SECRET, lambda batch: None)
    n2 = Transport(N2, {N1: ("127.0.0.1", port_1)}, SECRET, received.append, on_forward=received.append)
    async with trio.open_nursery() as nursery:
        await nursery.start(n2.serve, "127.0.0.1", port_2)
        await nursery.start(n1.serve, "127.0.0.1", port_1)
        with trio.fail_after(WAIT_S):
            while N2 not in n1.connected_peers():
                await trio.sleep(0.01)
            await trio.sleep(0.05)  # the writer is waiting on its empty queue
            n1.send(NodeBatch(N1, N2, 0, ()))  # written at once from this task
            assert n1.stats.frames_queued == 0
            big = b"x" * BIG_BYTES
            assert n1.send_forward(Forward(N1, N2, (Command("propose", GroupId("g"), big),)))
            for marker in range(1, 201):  # behind the unsent rest of the big frame: queued, in order
                n1.send(NodeBatch(N1, N2, marker, ()))
            assert n1.stats.frames_queued == 200
            while len(received) < 202:
                await trio.sleep(0.01)
        closed = (n1.stats.connections_closed, n2.stats.connections_closed)
        nursery.cancel_scope.cancel()
    assert isinstance(received[0], NodeBatch) and received[0].incarnation == 0
    assert isinstance(received[1], Forward) and received[1].commands[0].data == big
    assert [batch.incarnation for batch in received[2:] if isinstance(batch, NodeBatch)] == list(range(1, 201))
    assert closed == (0, 0)
    assert n2.stats.frames_forged == 0 and n2.stats.frames_replayed == 0
