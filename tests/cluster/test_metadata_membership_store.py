"""`MetadataStore` membership in one process (two stores on loopback): admission, refusals, cache, removal."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import trio

from cluster.metadata import membership as mb
from cluster.metadata import model as md
from cluster.metadata.durable import DurableSnapshot
from cluster.metadata.secret import ClusterSecretError
from cluster.metadata.store import JoinRefused, LeftClusterError, MetadataStore, StoreConfig

SECRET = "membership-test-secret-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _endpoints(name: str) -> mb.NodeEndpoints:
    return mb.NodeEndpoints(name, "127.0.0.1", _free_port(), _free_port(), _free_port(), _free_port())


def _config(e: mb.NodeEndpoints, peers: tuple[str, ...], data_dir: Path) -> StoreConfig:
    return StoreConfig(e.name, e.metadata_address, peers, SECRET, data_dir, raft_min_timeout_s=0.3,
                       raft_max_timeout_s=0.8, connection_timeout_s=1.5, start_timeout_s=20, endpoints=e)


async def _until(predicate: object, timeout_s: float = 20.0) -> None:
    with trio.fail_after(timeout_s):
        while not predicate():  # type: ignore[operator]
            await trio.sleep(0.05)


async def test_admission_refusals_cache_and_removal(tmp_path: Path) -> None:
    ea, eb = _endpoints("a"), _endpoints("b")
    a = MetadataStore(_config(ea, (), tmp_path / "a"))
    await a.start()
    b: MetadataStore | None = None
    try:
        assert a.members() == (ea.metadata_address,)
        assert a.state.nodes["a"].raft_port == ea.raft_port  # the endpoints are recorded at start

        newer = mb.JoinRequest(eb, md.PROTOCOL_VERSION + 1)
        with pytest.raises(JoinRefused, match="protocol version"):
            await MetadataStore.request_join(ea.metadata_address, SECRET, newer, timeout_s=20)
        with pytest.raises(ClusterSecretError):
            await MetadataStore.request_join(ea.metadata_address, "another-secret-0123456789abcdef",
                                             mb.JoinRequest(eb, md.PROTOCOL_VERSION), timeout_s=20)
        taken = mb.JoinRequest(mb.NodeEndpoints("a", "127.0.0.1", 1, 2, _free_port(), 3), md.PROTOCOL_VERSION)
        with pytest.raises(JoinRefused, match="already a member"):
            await MetadataStore.request_join(ea.metadata_address, SECRET, taken, timeout_s=20)
        assert a.members() == (ea.metadata_address,) and set(a.state.nodes) == {"a"}  # nothing changed

        join = mb.JoinRequest(eb, md.PROTOCOL_VERSION)
        members = await MetadataStore.request_join(ea.metadata_address, SECRET, join, mb.JOIN_PHASE_RECORD)
        assert members == (ea.metadata_address,)  # recorded, not yet in the group
        assert a.state.nodes["b"].raft_port == eb.raft_port
        b = MetadataStore(_config(eb, members, tmp_path / "b"))
        async with trio.open_nursery() as nursery:  # a group of one commits the change only once b runs
            nursery.start_soon(MetadataStore.request_join, ea.metadata_address, SECRET, join, mb.JOIN_PHASE_ADD)
            await b.start()
        members = a.members()
        assert set(members) == {ea.metadata_address, eb.metadata_address}
        await a.apply(md.PutVhost("after-join"))
        await _until(lambda: "after-join" in b.state.vhosts)
        await _until(lambda: a.read_members_cache() == mb.MembersCache(tuple(sorted(members))))
        assert b.read_members_cache() == mb.MembersCache(tuple(sorted(members)))

        await b.transfer_leadership_away()
        await b.request_removal()
        await _until(lambda: a.members() == (ea.metadata_address,))
        b.mark_left()
        b.close()
        with pytest.raises(LeftClusterError):
            await MetadataStore(_config(eb, (), tmp_path / "b")).start()
        b = None
        await a.apply(md.PutVhost("alone-again"))  # a alone is a majority of its group again
        assert a.read_members_cache() == mb.MembersCache((ea.metadata_address,))
    finally:
        a.close()
        if b is not None:
            b.close()


def test_snapshots_keep_the_group_members(tmp_path: Path) -> None:
    journal = str(tmp_path / "j")
    states: list[bytes] = []
    snap = DurableSnapshot(journal, lambda: b"state", states.append, lambda: ("h:1", "h:2"))
    last, prev = (b"x", 5, 1), (b"y", 4, 1)

    class _Node:
        def __init__(self, id_: str) -> None:
            self.id = id_

    snap.serialize(str(tmp_path / "s"), (last, prev, {_Node("h:3"), _Node("h:1")}))
    got_last, got_prev, cluster = snap.deserialize(str(tmp_path / "s"))
    assert (got_last, got_prev, states) == (last, prev, [b"state"])
    assert cluster is not None and sorted(n.id for n in cluster) == ["h:1", "h:3"]
