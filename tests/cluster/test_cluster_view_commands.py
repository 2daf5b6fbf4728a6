"""`ClusterView`'s membership commands against a fake cluster whose metadata is the real model (no processes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cluster.metadata import model as md
from node.runtime.cluster.view import ClusterView
from node.runtime.management_api import CommandError

NODES = ("n1", "n2", "n3", "n4")


class FakeCluster:
    """What ClusterView uses of ClusterRuntime: metadata applied with the real model, Raft peers connected."""

    def __init__(self, connected: tuple[str, ...] = ("n2", "n3", "n4")) -> None:
        self.name = "n1"
        self.broker = None
        me = SimpleNamespace(name="n1", host="h", amqp_port=5672, raft_port=25672, metadata_port=26672,
                             management_port=15672)
        self.layout = SimpleNamespace(names=NODES, me=me, secret="s" * 16)
        self.mirrored = md.MetadataState()
        self.group: tuple[str, ...] = ()  # the metadata group's members (metadata addresses)
        self.store = SimpleNamespace(state=self.mirrored, members=lambda: self.group)
        self.raft = SimpleNamespace(connected_peers=lambda: frozenset(connected))
        self.applied: list[md.Command] = []
        for name in NODES[:3]:
            self._apply(md.AddNode(name, f"h:{name}", md.PROTOCOL_VERSION))
        self._apply(md.PutVhost("/"))

    def _apply(self, command: md.Command) -> md.Outcome:
        self.mirrored, outcome = md.apply(self.mirrored, command)
        self.store.state = self.mirrored
        return outcome

    async def apply_definition(self, command: md.Command) -> md.Outcome:
        self.applied.append(command)
        return self._apply(command)

    def queue(self, name: str, members: tuple[str, ...], type_: str = "quorum") -> None:
        self._apply(md.DeclareQueue(md.QueueRecord("/", name, type_, leader=members[0], members=members)))


def _view(cluster: FakeCluster) -> ClusterView:
    return ClusterView(cluster, node_name="n1")


async def test_add_and_delete_member() -> None:
    cluster = FakeCluster()
    cluster._apply(md.AddNode("n4", "h:n4", md.PROTOCOL_VERSION))
    cluster.queue("q", ("n1", "n2", "n3"))
    view = _view(cluster)
    assert (await view.run_command("add_member", {"vhost": "/", "queue": "q", "node": "n4"}))["members"] == \
        ["n1", "n2", "n3", "n4"]
    assert (await view.run_command("delete_member", {"vhost": "/", "queue": "q", "node": "n1"}))["members"] == \
        ["n2", "n3", "n4"]
    with pytest.raises(CommandError) as unknown:
        await view.run_command("add_member", {"vhost": "/", "queue": "q", "node": "n9"})
    assert unknown.value.status == 404
    with pytest.raises(CommandError) as missing:
        await view.run_command("add_member", {"vhost": "/", "queue": "nope", "node": "n4"})
    assert missing.value.status == 404


async def test_grow_all_or_even_and_shrink_keeps_last_members() -> None:
    cluster = FakeCluster()
    cluster._apply(md.AddNode("n4", "h:n4", md.PROTOCOL_VERSION))
    cluster.queue("odd", ("n1", "n2", "n3"))
    cluster.queue("even", ("n1", "n2"))
    cluster.queue("classic", ("n1",), "classic")
    cluster.queue("only", ("n4",))
    view = _view(cluster)
    grown = await view.run_command("grow", {"node": "n4", "strategy": "even"})
    assert grown["grown"] == [{"vhost": "/", "queue": "even"}]
    grown = await view.run_command("grow", {"node": "n4", "strategy": "all", "queue_pattern": "o*"})
    assert grown["grown"] == [{"vhost": "/", "queue": "odd"}]
    assert cluster.mirrored.queues[("/", "classic")].members == ("n1",)
    shrunk = await view.run_command("shrink", {"node": "n4"})
    assert {s["queue"] for s in shrunk["shrunk"]} == {"even", "odd"}
    assert shrunk["skipped"] == [{"vhost": "/", "queue": "only", "reason": "last member"}]
    with pytest.raises(CommandError):
        await view.run_command("grow", {"node": "n4", "strategy": "some"})


async def test_forget_a_down_node_moves_its_memberships_and_removes_it() -> None:
    cluster = FakeCluster(connected=("n2",))
    cluster._apply(md.AddNode("n4", "h:n4", md.PROTOCOL_VERSION))
    cluster.queue("q", ("n1", "n2", "n3"))
    view = _view(cluster)
    with pytest.raises(CommandError) as running:
        await view.run_command("forget_cluster_node", {"node": "n2"})
    assert running.value.status == 409
    with pytest.raises(CommandError):
        await view.run_command("forget_cluster_node", {"node": "n1"})
    answer = await view.run_command("forget_cluster_node", {"node": "n3"})
    assert answer["moved"] == [{"vhost": "/", "queue": "q", "to": "n4"}]
    assert cluster.mirrored.queues[("/", "q")].members == ("n1", "n2", "n4")
    assert "n3" not in cluster.mirrored.nodes


async def test_join_and_leave_refusals_change_nothing() -> None:
    cluster = FakeCluster()
    view = _view(cluster)
    statuses = []
    with pytest.raises(CommandError) as bad_seed:
        await view.run_command("join_cluster", {"node": "host:notaport"})
    statuses.append(bad_seed.value.status)
    with pytest.raises(CommandError) as alone:  # a lone node has no cluster to leave
        await view.run_command("leave_cluster", {})
    statuses.append(alone.value.status)
    cluster.group = ("h:26672", "h2:26672")
    with pytest.raises(CommandError) as member:  # already in a cluster: leave first
        await view.run_command("join_cluster", {"node": "h3:5672"})
    statuses.append(member.value.status)
    assert statuses == [400, 409, 409]
    assert cluster.applied == []
