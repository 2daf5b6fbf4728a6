"""The command router (routing.py) on a real MultiRaft without I/O, the forward frame codec, and a transport
that meets a frame kind it does not know."""

from __future__ import annotations

import random

import cbor2
import pytest
import trio

from cluster.authlink.frames import FrameSealer, session_keys
from cluster.authlink.handshake import CHALLENGE_BYTES, RAFT_LINK, FrameReader, frame
from cluster.raft.core.multiraft import MultiRaft, MultiRaftConfig, NodeBatch
from cluster.raft.core.types import (
    ConfChange,
    ConfOp,
    GroupId,
    Heartbeat,
    Index,
    Membership,
    NodeId,
    Role,
    Term,
)
from cluster.raft.runtime.codec import (
    CodecError,
    Command,
    Forward,
    decode_frame,
    encode_batch,
    encode_forward,
)
from cluster.raft.runtime.routing import CommandRouter
from cluster.raft.runtime.transport import Transport
from tests.raft.test_runtime_cluster import _free_ports

N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")
LED = GroupId("led-here")  # n1 is its only voter, so n1 leads it
FOLLOWED = GroupId("followed")  # n1 follows n2
LEADERLESS = GroupId("leaderless")


def _multi() -> MultiRaft:
    multi = MultiRaft(N1, MultiRaftConfig(), random.Random(1).randrange)
    multi.add_group(LED, Membership(frozenset({N1})))
    multi.add_group(FOLLOWED, Membership(frozenset({N1, N2, N3})))
    multi.add_group(LEADERLESS, Membership(frozenset({N1, N2, N3})))
    multi.groups[LED].campaign()
    for _ in range(5):
        ready = multi.ready()
        multi.advance(ready)
    assert multi.groups[LED].role is Role.LEADER
    multi.step(NodeBatch(N2, N1, 0, ((FOLLOWED, Heartbeat(N2, N1, Term(1), Index(0))),)))
    assert multi.groups[FOLLOWED].lead == N2
    return multi


def test_commands_go_to_the_local_leader_or_are_forwarded_to_the_known_one() -> None:
    multi, router = _multi(), CommandRouter(N1)
    last = multi.groups[LED].log.last_index()
    assert router.offer(Command("propose", LED, b"here"))
    assert router.offer(Command("propose", FOLLOWED, b"there"))
    assert router.offer(Command("transfer", FOLLOWED, b"n3"))
    forwards = router.route(multi, now_ms=0, retry_held=False)
    assert multi.groups[LED].log.last_index() == last + 1
    assert forwards == [Forward(N1, N2, (Command("propose", FOLLOWED, b"there", hops=1),
                                         Command("transfer", FOLLOWED, b"n3", hops=1)))]
    assert (router.stats.local, router.stats.forwarded, len(router)) == (1, 2, 0)


def test_without_a_leader_a_command_is_held_then_dropped_after_the_hold() -> None:
    multi, router = _multi(), CommandRouter(N1, hold_ms=1000)
    router.offer(Command("propose", LEADERLESS, b"a"))
    router.offer(Command("propose", GroupId("not-hosted"), b"b"))
    assert router.route(multi, now_ms=0, retry_held=False) == []
    assert router.held_count == 2
    assert router.route(multi, now_ms=999, retry_held=True) == []
    assert router.held_count == 2
    multi.step(NodeBatch(N3, N1, 0, ((LEADERLESS, Heartbeat(N3, N1, Term(1), Index(0))),)))
    assert router.route(multi, now_ms=999, retry_held=False) == []  # held ones wait for retry_held
    forwards = router.route(multi, now_ms=999, retry_held=True)
    assert forwards == [Forward(N1, N3, (Command("propose", LEADERLESS, b"a", hops=1),))]
    router.route(multi, now_ms=1000, retry_held=True)
    assert (router.held_count, router.stats.expired) == (0, 1)


def test_bounds_hops_frame_sizes_and_bad_commands() -> None:
    multi = _multi()
    router = CommandRouter(N1, queued_max=3, hops_max=2, frame_commands_max=2, frame_bytes_max=1 << 20)
    assert router.offer(Command("propose", FOLLOWED, b"1", hops=2))  # forwarded twice already: dropped
    assert router.offer(Command("conf", LED, b"nonsense"))  # undecodable change: refused
    assert router.offer(Command("transfer", LED, b"n1"))  # to itself: refused
    assert not router.offer(Command("propose", LED, b"4"))
    assert router.route(multi, now_ms=0, retry_held=False) == []
    assert (router.stats.hops_exceeded, router.stats.refused, router.stats.refused_full) == (1, 2, 1)
    for n in range(3):
        router.offer(Command("propose", FOLLOWED, bytes([n])))
    assert [len(f.commands) for f in router.route(multi, now_ms=0, retry_held=False)] == [2, 1]
    small = CommandRouter(N1, frame_bytes_max=100)
    small.offer(Command("propose", FOLLOWED, b"x" * 60))
    small.offer(Command("propose", FOLLOWED, b"y" * 60))
    assert [len(f.commands) for f in small.route(multi, now_ms=0, retry_held=False)] == [1, 1]


def test_a_membership_change_reaches_the_local_leader() -> None:
    multi, router = _multi(), CommandRouter(N1)
    router.offer(Command("conf", LED, ConfChange(ConfOp.ADD_LEARNER, N2).encode()))
    router.route(multi, now_ms=0, retry_held=False)
    assert router.stats.local == 1
    for _ in range(5):
        multi.advance(multi.ready())
    assert multi.groups[LED].membership == Membership(frozenset({N1}), frozenset({N2}))


def test_forward_frames_round_trip_and_unknown_kinds_decode_to_none() -> None:
    forward = Forward(N1, N2, (Command("propose", GroupId("g"), b"\x00data", 1), Command("conf", GroupId("h"),
                                                                                        b"remove n3", 0)))
    assert decode_frame(encode_forward(forward)) == forward
    batch = NodeBatch(N1, N2, 3, ())
    assert decode_frame(encode_batch(batch)) == batch
    assert decode_frame(cbor2.dumps({"k": "from-the-future", "x": 1})) is None
    for bad in [cbor2.dumps({"k": "fwd", "src": "n1"}), cbor2.dumps({"k": "fwd", "src": "n1", "dst": "n2",
                                                                       "cmds": [["drop-table", "g", b"", 0]]}),
                cbor2.dumps(7), b"\xff\xff"]:
        with pytest.raises(CodecError):
            decode_frame(bad)


async def test_a_transport_ignores_a_frame_kind_it_does_not_know_and_delivers_forwards() -> None:
    (port,) = _free_ports(1)
    batches: list[NodeBatch] = []
    forwards: list[Forward] = []
    b = Transport(N2, {N1: ("127.0.0.1", 1)}, b"k", batches.append, on_forward=forwards.append)
    async with trio.open_nursery() as nursery:
        await nursery.start(b.serve, "127.0.0.1", port)
        with trio.fail_after(30):
            stream = await trio.open_tcp_stream("127.0.0.1", port)  # we play n1, the dialer
            reader = FrameReader(stream)
            challenge = await reader.read()
            assert challenge is not None
            await stream.send_all(frame(cbor2.dumps([N1, RAFT_LINK.proof(b"k", b"dial", challenge, N1),
                                                     b"c" * CHALLENGE_BYTES])))
            assert await reader.read() is not None
            sealer = FrameSealer(session_keys(b"k", challenge, b"c" * CHALLENGE_BYTES, N1, N2, dialer_side=True).send)
            forward = Forward(N1, N2, (Command("propose", GroupId("g"), b"p"),))
            await stream.send_all(sealer.seal(cbor2.dumps({"k": "newer-kind"})) + sealer.seal(encode_forward(forward))
                                  + sealer.seal(encode_batch(NodeBatch(N1, N2, 0, ()))))
            while not batches:
                await trio.sleep(0.01)
            assert N1 in b.connected_peers()  # the unknown frame did not cost the connection
            await stream.aclose()
        nursery.cancel_scope.cancel()
    assert forwards == [forward] and b.stats.frames_ignored == 1 and b.stats.forwards_received == 1
