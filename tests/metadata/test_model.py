"""Pure tests of the metadata state machine: semantics, cascades, idempotence under duplication, snapshots."""

from __future__ import annotations

import dataclasses

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.metadata import model as m
from cluster.metadata.model import (
    AddNode,
    AddQueueMember,
    Bind,
    BindingRecord,
    ClearPolicy,
    Command,
    DeclareExchange,
    DeclareQueue,
    DeleteExchange,
    DeleteQueue,
    DeleteUser,
    DeleteVhost,
    ExchangeRecord,
    MetadataState,
    PolicyRecord,
    PutUser,
    PutVhost,
    QueueRecord,
    RemoveNode,
    RemoveQueueMember,
    SetPermissions,
    SetPolicy,
    SetQueueLeader,
    SetQueueMembers,
    Unbind,
)


def run(commands: list[Command], state: MetadataState | None = None) -> MetadataState:
    state = state or MetadataState()
    for c in commands:
        state, _ = m.apply(state, c)
    return state


def q(name: str, vhost: str = "/", leader: str = "a", members: tuple[str, ...] = ("a", "b", "c")) -> QueueRecord:
    return QueueRecord(vhost, name, "quorum", leader=leader, members=members)


BASE: list[Command] = [PutVhost("/"), DeclareExchange(ExchangeRecord("/", "x", "topic")),
                       DeclareQueue(q("q1"))]


def test_declare_reports_created_then_unchanged() -> None:
    s, out = m.apply(MetadataState(), PutVhost("/"))
    assert out.changes == (m.Change("vhost", ("/",), "created"),
                           *(m.Change("exchange", ("/", name), "created") for name, _ in m.PREDECLARED_EXCHANGES))
    s2, out2 = m.apply(s, PutVhost("/"))
    assert out2.ok and out2.changes == () and s2 == s


def test_command_id_returns_first_outcome() -> None:
    s, first = m.apply(MetadataState(), PutVhost("/", cid="c1"))
    s2, again = m.apply(s, PutVhost("/", cid="c1"))
    assert again.duplicate and again.changes == first.changes and s2 == s


def test_barrier_changes_nothing_and_is_not_remembered() -> None:
    s = run(BASE)
    s2, out = m.apply(s, m.Barrier(cid="b1"))
    assert s2 is s and out == m.Outcome()


def test_dedup_table_is_bounded() -> None:
    s = MetadataState()
    for i in range(m.DEDUP_MAX + 10):
        s, _ = m.apply(s, PutVhost(f"v{i % 3}", cid=f"c{i}"))
    assert len(s.applied) == m.DEDUP_MAX
    assert "c0" not in s.applied and f"c{m.DEDUP_MAX + 9}" in s.applied


def test_incompatible_node_version_is_refused_and_changes_nothing() -> None:
    s = run([AddNode("a", "127.0.0.1:1", m.PROTOCOL_VERSION)])
    s2, out = m.apply(s, AddNode("b", "127.0.0.1:2", m.PROTOCOL_VERSION + 1))
    assert not out.ok and "version" in out.refused
    assert s2 == s


def test_redeclare_keeps_placement_and_refuses_a_different_definition() -> None:
    s = run(BASE)
    s2, out = m.apply(s, DeclareQueue(q("q1", leader="b")))
    assert out.ok and s2.queues[("/", "q1")].leader == "a"
    _, out = m.apply(s, DeclareQueue(QueueRecord("/", "q1", "classic", leader="a", members=("a",))))
    assert "different definition" in out.refused


def test_queue_placement_commands() -> None:
    s = run([*BASE, SetQueueLeader("/", "q1", "c")])
    assert s.queues[("/", "q1")].leader == "c"
    _, out = m.apply(s, SetQueueLeader("/", "q1", "z"))
    assert not out.ok
    s = run([SetQueueMembers("/", "q1", ("a", "b"))], s)
    assert s.queues[("/", "q1")].leader == "a" and s.queues[("/", "q1")].members == ("a", "b")


def test_the_initial_leader_is_fixed_at_declaration() -> None:
    """The Raft groups start with their term-1 vote for it (cluster.raft.core.raft.bootstrap_state): it must
    never change, whatever happens to the leader and the members afterwards."""
    s = run([PutVhost("/"), DeclareQueue(dataclasses.replace(q("q1"), initial_leader="a"))])
    s = run([SetQueueLeader("/", "q1", "c"), SetQueueMembers("/", "q1", ("b", "c"))], s)
    assert s.queues[("/", "q1")].initial_leader == "a" and s.queues[("/", "q1")].leader == "c"
    s2, out = m.apply(s, DeclareQueue(dataclasses.replace(q("q1", leader="c"), initial_leader="c")))
    assert out.ok and s2.queues[("/", "q1")].initial_leader == "a"  # a redeclare changes nothing
    _, out = m.apply(run([PutVhost("/")]), DeclareQueue(dataclasses.replace(q("q2"), initial_leader="b")))
    assert "initial leader" in out.refused
    assert m.from_plain(m.to_plain(s.queues[("/", "q1")])) == s.queues[("/", "q1")]


def test_remove_node_refuses_while_a_member_unless_forced() -> None:
    nodes: list[Command] = [AddNode(n, f"{n}:1", m.PROTOCOL_VERSION) for n in "abc"]
    s = run([*nodes, *BASE, DeclareQueue(QueueRecord("/", "solo", "classic", leader="c", members=("c",))),
             Bind(BindingRecord("/", "x", "solo"))])
    s2, out = m.apply(s, RemoveNode("c"))
    assert "node c is still a member of 2 queue(s)" in out.refused
    assert s2 == s
    s2, out = m.apply(s, RemoveNode("c", force=True))
    assert out.ok and "c" not in s2.nodes and ("/", "solo") not in s2.queues and s2.bindings == {}
    assert s2.queues[("/", "q1")].members == ("a", "b")
    s3, out = m.apply(s2, RemoveNode("c"))
    assert out.ok and out.changes == () and s3 == s2


def test_grow_and_shrink_one_member_at_a_time() -> None:
    s = run([AddNode("d", "d:1", m.PROTOCOL_VERSION), *BASE])
    s, out = m.apply(s, AddQueueMember("/", "q1", "d"))
    assert out.ok and s.queues[("/", "q1")].members == ("a", "b", "c", "d")
    s2, out = m.apply(s, AddQueueMember("/", "q1", "d"))
    assert out.changes == () and s2 == s
    assert "no node" in m.apply(s, AddQueueMember("/", "q1", "zz"))[1].refused
    s, out = m.apply(s, RemoveQueueMember("/", "q1", "a"))
    assert s.queues[("/", "q1")].members == ("b", "c", "d") and s.queues[("/", "q1")].leader == "b"
    for node in "bc":
        s, _ = m.apply(s, RemoveQueueMember("/", "q1", node))
    _, out = m.apply(s, RemoveQueueMember("/", "q1", "d"))
    assert "last member" in out.refused


def test_deletes_cascade() -> None:
    bind = Bind(BindingRecord("/", "x", "q1", "queue", "k.#"))
    s = run([*BASE, bind, PutUser("u", "h"), SetPermissions("u", "/"),
             SetPolicy(PolicyRecord("/", "p", "^q"))])
    assert len(s.bindings) == 1 and len(s.permissions) == 1
    assert run([DeleteQueue("/", "q1")], s).bindings == {}
    assert run([DeleteExchange("/", "x")], s).bindings == {}
    assert run([DeleteUser("u")], s).permissions == {}
    gone = run([DeleteVhost("/")], s)
    assert gone.definitions() == run([PutUser("u", "h")]).definitions()


def test_bind_needs_both_ends() -> None:
    s = run(BASE)
    _, out = m.apply(s, Bind(BindingRecord("/", "x", "nope")))
    assert "no queue" in out.refused
    _, out = m.apply(s, Bind(BindingRecord("/", "nope", "q1")))
    assert "no exchange" in out.refused


# ------------------------------------------------------------------------------------------ property tests

names = st.sampled_from(["a", "b", "c"])
vhosts = st.sampled_from(["/", "v"])
nodes = st.sampled_from(["n1", "n2", "n3"])
args = st.dictionaries(st.sampled_from(["x-k", "x-m"]), st.integers(0, 3) | st.text(max_size=2), max_size=2)


def _queue(vh: str, name: str, members: list[str], qtype: str, a: dict[str, object]) -> QueueRecord:
    return QueueRecord(vh, name, qtype, arguments=a, leader=members[0], members=tuple(members))


queue_records = st.builds(_queue, vhosts, names, st.lists(nodes, min_size=1, max_size=3, unique=True),
                          st.sampled_from(["classic", "quorum"]), args)
bindings = st.builds(BindingRecord, vhosts, names, names, st.sampled_from(["queue", "exchange"]),
                     st.sampled_from(["", "k", "k.*"]), args)

commands = st.one_of(
    st.just(m.Barrier()),
    st.builds(AddNode, nodes, st.sampled_from(["h:1", "h:2"]), st.sampled_from([1, 1, 2])),
    st.builds(RemoveNode, nodes, st.booleans()),
    st.builds(PutVhost, vhosts, st.sampled_from(["", "d"])),
    st.builds(DeleteVhost, vhosts),
    st.builds(PutUser, names, st.sampled_from(["h1", "h2"]), st.sampled_from([(), ("administrator",)])),
    st.builds(DeleteUser, names),
    st.builds(SetPermissions, names, vhosts, st.sampled_from([".*", "^a"])),
    st.builds(DeclareExchange, st.builds(ExchangeRecord, vhosts, names, st.sampled_from(["direct", "topic"]))),
    st.builds(DeleteExchange, vhosts, names),
    st.builds(Bind, bindings),
    st.builds(Unbind, bindings),
    st.builds(DeclareQueue, queue_records),
    st.builds(DeleteQueue, vhosts, names),
    st.builds(SetQueueLeader, vhosts, names, nodes),
    st.builds(SetQueueMembers, vhosts, names, st.lists(nodes, min_size=1, max_size=3, unique=True).map(tuple)),
    st.builds(AddQueueMember, vhosts, names, nodes),
    st.builds(RemoveQueueMember, vhosts, names, nodes),
    st.builds(SetPolicy, st.builds(PolicyRecord, vhosts, names, st.sampled_from(["^a", ".*"]))),
    st.builds(ClearPolicy, vhosts, names),
)


def with_ids(cmds: list[Command]) -> list[Command]:
    from dataclasses import replace

    return [replace(c, cid=f"cmd-{i}") for i, c in enumerate(cmds)]


@settings(max_examples=300, deadline=None)
@given(st.lists(commands, max_size=40), st.data())
def test_random_duplication_gives_the_same_state(cmds: list[Command], data: st.DataObject) -> None:
    cmds = with_ids(cmds)
    # every duplicate lands after its original: a retry of a command whose first attempt did commit
    stream: list[Command] = []
    for c in cmds:
        stream.append(c)
        pending = data.draw(st.integers(0, 2))
        stream.extend([c] * pending)
    later = data.draw(st.lists(st.sampled_from(cmds), max_size=10)) if cmds else []
    plain = run(cmds)
    duplicated = run(stream + later)
    assert duplicated == plain


@settings(max_examples=200, deadline=None)
@given(st.lists(commands, max_size=40))
def test_snapshot_round_trip_through_cbor(cmds: list[Command]) -> None:
    state = run(with_ids(cmds))
    data = cbor2.loads(cbor2.dumps(m.snapshot(state)))
    restored = m.restore(data)
    assert restored == state
    # and a restored replica keeps behaving the same
    more = with_ids(cmds)
    assert run(more, restored) == run(more, state)


@settings(max_examples=200, deadline=None)
@given(commands)
def test_command_codec_round_trip(cmd: Command) -> None:
    assert m.command_from_dict(cbor2.loads(cbor2.dumps(m.command_to_dict(cmd)))) == cmd


def test_the_codec_accepts_exactly_the_commands_apply_handles() -> None:
    """`command_from_dict` (cluster/metadata/state.py) checks against COMMAND_TYPES, `apply` dispatches by its table."""
    assert set(m.COMMAND_TYPES) == set(m._HANDLERS)
    with pytest.raises(ValueError, match="is not a command"):
        m.command_from_dict(m.to_plain(QueueRecord("v", "q")))


@settings(max_examples=200, deadline=None)
@given(st.lists(commands, max_size=30), st.lists(commands, max_size=30))
def test_diff_names_exactly_what_differs(first: list[Command], second: list[Command]) -> None:
    a, b = run(first), run(second)
    assert m.diff(a, a) == ()
    changes = m.diff(a, b)
    assert len(set(changes)) == len(changes)
    for attr, kind in m._KINDS.items():
        before, after = getattr(a, attr), getattr(b, attr)
        expected = ({k for k in before if k not in after} | {k for k in after if k not in before}
                    | {k for k in after if k in before and before[k] != after[k]})
        assert len([c for c in changes if c.kind == kind]) == len(expected)
    created = {c.key for c in m.diff(MetadataState(), b) if c.action == "created" and c.kind == "queue"}
    assert created == set(b.queues)


def test_every_vhost_has_the_predeclared_exchanges_and_binds_to_them() -> None:
    from node.broker.vhost import PREDECLARED

    assert m.PREDECLARED_EXCHANGES == PREDECLARED  # the broker's vhosts have the same ones
    s = run([PutVhost("/"), PutVhost("v2"), DeclareQueue(q("q1")), DeclareQueue(q("q2", vhost="v2"))])
    for vhost in ("/", "v2"):
        for name, kind in m.PREDECLARED_EXCHANGES:
            internal = name == "amq.rabbitmq.trace"  # the Firehose's exchange is internal, as in RabbitMQ
            assert s.exchanges[(vhost, name)] == ExchangeRecord(vhost, name, kind, internal=internal)
    s, out = m.apply(s, m.Bind(BindingRecord("v2", "amq.fanout", "q2", "queue", "")))
    assert out.ok and out.changes == (m.Change("binding", ("v2", "amq.fanout", "queue", "q2", ""), "created"),)
    s, out = m.apply(s, m.Bind(BindingRecord("/", "amq.topic", "amq.direct", "exchange", "a.#")))
    assert out.ok
    # The vhost goes with them; a new one of the same name has them again.
    s, _ = m.apply(s, m.DeleteVhost("v2"))
    assert not any(key[0] == "v2" for key in s.exchanges) and not any(key[0] == "v2" for key in s.bindings)
    s, _ = m.apply(s, PutVhost("v2"))
    assert ("v2", "amq.direct") in s.exchanges


def test_a_bind_to_a_predeclared_exchange_missing_from_an_older_state_adds_it() -> None:
    s = run([PutVhost("/"), DeclareQueue(q("q1"))])
    older = dataclasses.replace(s, exchanges={k: v for k, v in s.exchanges.items() if not k[1].startswith("amq.")})
    s2, out = m.apply(older, m.Bind(BindingRecord("/", "amq.direct", "q1", "queue", "k")))
    assert out.ok and all(("/", name) in s2.exchanges for name, _ in m.PREDECLARED_EXCHANGES)
    assert m.Change("exchange", ("/", "amq.direct"), "created") in out.changes
    # A refused bind changes nothing, not even the missing exchanges.
    s3, out = m.apply(older, m.Bind(BindingRecord("/", "amq.direct", "nope", "queue", "k")))
    assert out.refused and s3 is older
