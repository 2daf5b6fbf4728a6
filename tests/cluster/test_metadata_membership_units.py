"""The pure rules of online metadata membership (`cluster.metadata.membership`) and the AddNode endpoints."""

from __future__ import annotations

import cbor2
import pytest

from cluster.metadata import membership as mb
from cluster.metadata import model as md


def _ep(name: str, port: int) -> mb.NodeEndpoints:
    return mb.NodeEndpoints(name, "127.0.0.1", port, port + 20_000, port + 21_000, port + 10_000)


def _record(e: mb.NodeEndpoints, with_endpoints: bool = True) -> md.NodeRecord:
    if not with_endpoints:
        return md.NodeRecord(e.name, e.metadata_address, 1)
    return md.NodeRecord(e.name, e.metadata_address, 1, "up", e.host, e.amqp_port, e.raft_port, e.management_port)


N1, N2, N3, N4 = _ep("n1", 4001), _ep("n2", 4002), _ep("n3", 4003), _ep("n4", 4004)


def test_cluster_is_the_records_plus_listed_nodes_in_the_group() -> None:
    configured = (N1, N2, N3)
    records = {"n1": _record(N1), "n4": _record(N4)}
    group = {N1.metadata_address, N2.metadata_address, N4.metadata_address}
    chosen = mb.cluster_endpoints(records, configured, group, N1)
    # n2: listed and in the group (not recorded yet); n3: listed but not in the group (forgotten); n4: recorded
    assert [e.name for e in chosen] == ["n1", "n2", "n4"]
    assert chosen[2] == N4


def test_a_record_without_endpoints_takes_them_from_cluster_nodes_or_is_skipped() -> None:
    records = {"n2": _record(N2, with_endpoints=False), "n9": md.NodeRecord("n9", "h:1", 1)}
    chosen = mb.cluster_endpoints(records, (N1, N2), set(), N1)
    assert [e.name for e in chosen] == ["n1", "n2"]
    assert chosen[1] == N2


def test_a_listed_node_is_reached_the_way_cluster_nodes_says() -> None:
    via_proxy = mb.NodeEndpoints("n2", "127.0.0.1", N2.amqp_port, 17000, N2.metadata_port, N2.management_port)
    chosen = mb.cluster_endpoints({"n2": _record(N2)}, (N1, via_proxy), set(), N1)
    assert chosen[1] == via_proxy


def test_this_node_is_always_in_with_its_own_endpoints() -> None:
    stale = mb.NodeEndpoints("n1", "10.0.0.1", 1, 2, 3, 4)
    chosen = mb.cluster_endpoints({"n1": _record(stale)}, (), set(), N1)
    assert chosen == (N1,)


def test_record_needs_endpoints() -> None:
    assert not mb.record_needs_endpoints(None, N1)  # not joined: the join records them
    assert mb.record_needs_endpoints(_record(N1, with_endpoints=False), N1)
    assert not mb.record_needs_endpoints(_record(N1), N1)
    assert mb.record_needs_endpoints(_record(N1), _ep("n1", 4009))


def test_add_node_records_endpoints_and_a_bare_restart_keeps_them() -> None:
    state, outcome = md.apply(md.MetadataState(), mb.add_node_command(N1, 1))
    assert outcome.ok and state.nodes["n1"] == _record(N1)
    state, _ = md.apply(state, md.SetNodeState("n1", "down"))
    state, outcome = md.apply(state, md.AddNode("n1", N1.metadata_address, 1))  # a start without endpoints
    assert state.nodes["n1"] == _record(N1)  # endpoints kept, marked up again
    restored = md.restore(cbor2.loads(cbor2.dumps(md.snapshot(state))))
    assert restored.nodes == state.nodes


@pytest.mark.parametrize(("text", "address"), [
    ("rabbit@node1", "node1:26672"),
    ("node1", "node1:26672"),
    ("127.0.0.1:4001", "127.0.0.1:25001"),
    ("n1=127.0.0.1:4001", "127.0.0.1:25001"),
    ("n1=127.0.0.1:4001:5001:6001", "127.0.0.1:6001"),
    ("n1@127.0.0.1:60000", "127.0.0.1:39000"),  # +21000 would pass 65535: -21000, as the runner writes it
    ("[::1]:4001", "::1:25001"),
])
def test_parse_seed(text: str, address: str) -> None:
    assert mb.parse_seed(text) == address


@pytest.mark.parametrize("text", ["", "host:port", "host:0", "h:1:2:3:4", "=:1"])
def test_parse_seed_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        mb.parse_seed(text)


def test_join_request_round_trip_and_refusals() -> None:
    request = mb.JoinRequest(N4, 1)
    assert mb.decode_join_request(mb.encode_join_request(request)) == request
    for bad in (None, b"", b"\xff", cbor2.dumps([1, "n4"]), cbor2.dumps([2, *([0] * 7)]),
                cbor2.dumps([1, "n4", "h", 0, 1, 1, 1, 1]), cbor2.dumps([1, "", "h", 1, 1, 1, 1, 1]),
                cbor2.dumps([1, "n\n4", "h", 1, 1, 1, 1, 1])):
        with pytest.raises(mb.MembershipDecodeError):
            mb.decode_join_request(bad)
    command = request.add_node("cid-1")
    assert (command.cid, command.host, command.raft_port) == ("cid-1", N4.host, N4.raft_port)


def test_join_refusal() -> None:
    records = {"n1": _record(N1), "n2": _record(N2)}
    assert mb.join_refusal(records, 1, mb.JoinRequest(N4, 1)) == ""
    assert mb.join_refusal(records, 1, mb.JoinRequest(N2, 1)) == ""  # a re-join of the same node
    assert "protocol version" in mb.join_refusal(records, 1, mb.JoinRequest(N4, 2))
    taken = mb.NodeEndpoints("n2", "10.0.0.9", 1, 2, 3, 4)
    assert "already a member" in mb.join_refusal(records, 1, mb.JoinRequest(taken, 1))
    same_address = mb.NodeEndpoints("n9", N2.host, 1, 2, N2.metadata_port, 4)
    assert "already a member" in mb.join_refusal(records, 1, mb.JoinRequest(same_address, 1))


def test_members_cache_round_trip_and_start_partners() -> None:
    cache = mb.MembersCache(("h:2", "h:1"))
    decoded = mb.decode_members_cache(mb.encode_members_cache(cache))
    assert decoded == mb.MembersCache(("h:1", "h:2"))
    assert mb.decode_members_cache(mb.encode_members_cache(mb.MembersCache(("h:1",), left=True))).left
    assert mb.start_partners(decoded, ("h:9",), "h:1") == ("h:2",)  # the cache wins over cluster_nodes
    assert mb.start_partners(None, ("h:9",), "h:1") == ("h:9",)  # the first start: cluster_nodes
    for bad in (b"", b"\x00", cbor2.dumps({"format": 9}), cbor2.dumps({"format": 1, "addresses": [1], "left": False}),
                cbor2.dumps({"format": 1, "addresses": ["h:1"] * 100, "left": False})):
        with pytest.raises(mb.MembershipDecodeError):
            mb.decode_members_cache(bad)
