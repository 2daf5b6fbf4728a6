"""Refusal tracking of the Raft transport: the pure rule (`RefusalTracker`), what counts as a refusal, and real
transports on loopback: a peer whose transport is gone is reported refusing by its dialer and by its listener
(probes); one that comes back is not; a port that accepts but never answers (a paused process) is not refusing."""

from __future__ import annotations

import socket
from collections.abc import Callable

import trio

from cluster.raft.core.types import NodeId
from cluster.raft.runtime.transport import RefusalTracker, Transport, is_refusal
from tests.raft.test_runtime_cluster import _free_ports

N1, N2 = NodeId("n1"), NodeId("n2")
WAIT_S = 20


def test_refusing_needs_a_lost_link_and_enough_refusals_far_enough_apart() -> None:
    tracker = RefusalTracker(refusals_min=2, span_ms_min=200)
    tracker.attempt(N2, True, 0)
    tracker.attempt(N2, True, 500)
    assert not tracker.is_refusing(N2)  # never connected: the normal timing applies
    tracker.connected(N2)
    tracker.lost(N2)
    tracker.attempt(N2, True, 1000)
    assert not tracker.is_refusing(N2)  # one refusal
    tracker.attempt(N2, True, 1100)
    assert not tracker.is_refusing(N2)  # two, but only 100 ms apart (a quick restart)
    tracker.attempt(N2, True, 1200)
    assert tracker.is_refusing(N2) and tracker.refusing() == {N2}


def test_anything_but_a_refusal_breaks_the_run_and_a_connection_clears_it() -> None:
    tracker = RefusalTracker(refusals_min=2, span_ms_min=200)
    tracker.lost(N2)
    tracker.attempt(N2, True, 0)
    tracker.attempt(N2, False, 300)  # a connect that hung or completed (paused, partitioned)
    tracker.attempt(N2, True, 600)
    assert not tracker.is_refusing(N2)
    tracker.attempt(N2, True, 800)
    assert tracker.is_refusing(N2)
    tracker.connected(N2)
    assert tracker.refusing() == frozenset()
    tracker.lost(N2)  # a new loss starts from nothing
    assert not tracker.is_refusing(N2)
    tracker.attempt(N2, True, 900)
    tracker.attempt(N2, True, 1200)
    tracker.forget(N2)  # removed from the cluster
    assert tracker.refusing() == frozenset()


async def test_a_closed_port_is_a_refusal() -> None:
    (port,) = _free_ports(1)
    try:
        await trio.open_tcp_stream("127.0.0.1", port)
    except OSError as error:
        assert is_refusal(error)
    else:
        raise AssertionError("connected to a closed port")
    grouped = OSError("all attempts failed")
    grouped.__cause__ = ExceptionGroup("x", [ConnectionRefusedError(), ConnectionRefusedError()])
    assert is_refusal(grouped)
    grouped.__cause__ = ExceptionGroup("x", [ConnectionRefusedError(), TimeoutError()])
    assert not is_refusal(grouped)
    assert not is_refusal(OSError("host unreachable"))


async def _wait(condition: Callable[[], bool], what: str) -> None:
    with trio.fail_after(WAIT_S):
        while not condition():
            await trio.sleep(0.02)


async def _serve_in(scope: trio.CancelScope, transport: Transport, port: int,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with scope:
        await transport.serve("127.0.0.1", port, task_status=task_status)


async def test_the_dialer_sees_a_gone_peer_refusing_until_it_is_back() -> None:
    port_1, port_2 = _free_ports(2)
    t1 = Transport(N1, {N2: ("127.0.0.1", port_2)}, b"k", lambda batch: None)  # n1 dials n2
    async with trio.open_nursery() as nursery:
        await nursery.start(t1.serve, "127.0.0.1", port_1)
        for _ in range(2):  # n2 goes away and comes back, twice
            n2_scope = trio.CancelScope()
            t2 = Transport(N2, {N1: ("127.0.0.1", port_1)}, b"k", lambda batch: None)
            await nursery.start(_serve_in, n2_scope, t2, port_2)
            await _wait(lambda: N2 in t1.connected_peers(), "connected")
            assert t1.refusing_peers() == frozenset()
            n2_scope.cancel()
            await _wait(lambda: N2 in t1.refusing_peers(), "n2 refusing")
        t2 = Transport(N2, {N1: ("127.0.0.1", port_1)}, b"k", lambda batch: None)
        await nursery.start(t2.serve, "127.0.0.1", port_2)
        await _wait(lambda: N2 in t1.connected_peers(), "reconnected")
        assert t1.refusing_peers() == frozenset()
        nursery.cancel_scope.cancel()
    assert t1.stats.connections_dialed == 3


async def test_the_listener_probes_a_gone_dialer_and_stops_once_it_dials_again() -> None:
    port_1, port_2 = _free_ports(2)
    t2 = Transport(N2, {N1: ("127.0.0.1", port_1)}, b"k", lambda batch: None)  # n2 only listens for n1
    async with trio.open_nursery() as nursery:
        await nursery.start(t2.serve, "127.0.0.1", port_2)
        n1_scope = trio.CancelScope()
        t1 = Transport(N1, {N2: ("127.0.0.1", port_2)}, b"k", lambda batch: None)
        await nursery.start(_serve_in, n1_scope, t1, port_1)
        await _wait(lambda: N1 in t2.connected_peers(), "connected")
        n1_scope.cancel()
        await _wait(lambda: N1 in t2.refusing_peers(), "n1 refusing (probes)")
        t1 = Transport(N1, {N2: ("127.0.0.1", port_2)}, b"k", lambda batch: None)
        await nursery.start(_serve_in, trio.CancelScope(), t1, port_1)
        await _wait(lambda: N1 in t2.connected_peers(), "n1 back")
        assert t2.refusing_peers() == frozenset()
        await _wait(lambda: N1 not in t2._probing, "the probe loop ended")
        nursery.cancel_scope.cancel()
    assert t2.stats.auth_failures == 0  # a probe that reached n1's port was not counted as one


async def test_a_port_that_accepts_but_never_answers_is_not_refusing() -> None:
    """As a SIGSTOP-paused peer: its kernel still completes TCP connects, nothing answers the handshake."""
    port_1, port_2 = _free_ports(2)
    t1 = Transport(N1, {N2: ("127.0.0.1", port_2)}, b"k", lambda batch: None)
    async with trio.open_nursery() as nursery:
        await nursery.start(t1.serve, "127.0.0.1", port_1)
        n2_scope = trio.CancelScope()
        t2 = Transport(N2, {N1: ("127.0.0.1", port_1)}, b"k", lambda batch: None)
        await nursery.start(_serve_in, n2_scope, t2, port_2)
        await _wait(lambda: N2 in t1.connected_peers(), "connected")
        n2_scope.cancel()
        await _wait(lambda: N2 not in t1.connected_peers(), "link lost")
        silent = socket.socket()
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with trio.fail_after(WAIT_S):
            while True:  # n2's listener closes as its task unwinds
                try:
                    silent.bind(("127.0.0.1", port_2))
                    break
                except OSError:
                    await trio.sleep(0.01)
        silent.listen(16)
        silent.setblocking(False)
        held: list[socket.socket] = []
        try:
            with trio.fail_after(WAIT_S):
                while not held:  # wait for a redial to reach the silent port (held open, never answered)
                    try:
                        held.append(silent.accept()[0])
                    except BlockingIOError:
                        await trio.sleep(0.02)
            await _wait(lambda: t1.refusing_peers() == frozenset(), "the completed connect recorded")
            await trio.sleep(0.5)  # the handshake hangs meanwhile (it times out after 5 s): still not refusing
            assert t1.refusing_peers() == frozenset()
        finally:
            for sock in held:
                sock.close()
            silent.close()
        nursery.cancel_scope.cancel()
