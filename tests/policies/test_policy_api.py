"""/api/policies on a single node (in-process management server over a real Broker) and ClusterView's policy
commands against a fake cluster whose metadata is the real model: validation (400, nothing changed), 201/204,
404 for a missing policy, and the queue and exchange rows' `policy` / `effective_policy_definition`."""

from __future__ import annotations

from cluster.metadata import model as md
from node.broker.records import PolicyRecord
from node.clustering import definitions as cluster_defs
from node.runtime.cluster.view import ClusterView
from node.runtime.management_api import CommandError
from tests.broker.harness import connected
from tests.cluster.test_cluster_view_commands import FakeCluster
from tests.management.helpers import request, served_broker

CAP = {"pattern": "^jobs", "definition": {"max-length": 2, "overflow": "reject-publish"}, "priority": 1,
       "apply-to": "queues"}


async def test_single_node_policies_over_http() -> None:
    async with served_broker() as s:
        client = connected(s.broker)
        client.declare("jobs", durable=True)
        client.declare("other")
        status, _, _ = await request(s.port, "PUT", "/api/policies/%2F/cap", CAP)
        assert status == 201
        status, _, _ = await request(s.port, "PUT", "/api/policies/%2F/cap", CAP)
        assert status == 204
        _, _, rows = await request(s.port, "GET", "/api/policies/%2F")
        assert rows == [{"vhost": "/", "name": "cap", "pattern": "^jobs", "apply-to": "queues",
                         "definition": {"max-length": 2, "overflow": "reject-publish"}, "priority": 1}]
        _, _, jobs = await request(s.port, "GET", "/api/queues/%2F/jobs")
        assert jobs["policy"] == "cap"
        assert jobs["effective_policy_definition"] == {"max-length": 2, "overflow": "reject-publish"}
        _, _, other = await request(s.port, "GET", "/api/queues/%2F/other")
        assert other["policy"] is None and other["effective_policy_definition"] == {}
        assert s.broker.vhosts["/"].queues["jobs"].machine.args.max_length == 2
        assert any(isinstance(r, PolicyRecord) for e in s.emitted for r in getattr(e, "records", ()))

        status, _, body = await request(s.port, "PUT", "/api/policies/%2F/cap",
                                        {"pattern": "^jobs", "definition": {"max-length": "many"}})
        assert status == 400 and "max-length" in body["reason"]
        status, _, body = await request(s.port, "PUT", "/api/policies/%2F/bad", {"pattern": "(", "definition":
                                                                                {"max-length": 1}})
        assert status == 400 and "pattern" in body["reason"]
        status, _, body = await request(s.port, "PUT", "/api/policies/nowhere/p", CAP)
        assert status == 400 and "vhost" in body["reason"]
        _, _, rows = await request(s.port, "GET", "/api/policies")
        assert [r["name"] for r in rows] == ["cap"] and rows[0]["definition"]["max-length"] == 2

        status, _, _ = await request(s.port, "DELETE", "/api/policies/%2F/cap")
        assert status == 204
        status, _, _ = await request(s.port, "DELETE", "/api/policies/%2F/cap")
        assert status == 404
        assert s.broker.vhosts["/"].queues["jobs"].machine.args.max_length is None
        _, _, exchanges = await request(s.port, "GET", "/api/exchanges/%2F/amq.direct")
        assert exchanges["policy"] is None


async def test_cluster_view_validates_then_stores_in_the_metadata() -> None:
    cluster = FakeCluster()
    view = ClusterView(cluster, node_name="n1")
    args = {"vhost": "/", "name": "cap", "pattern": "^q", "definition": {"max-length": 3}}
    assert await view.run_command("set_policy", args) == {"created": True}
    assert await view.run_command("set_policy", {**args, "priority": 2}) == {"created": False}
    assert cluster.mirrored.policies[("/", "cap")].priority == 2
    assert cluster.mirrored.policies[("/", "cap")].apply_to == "all"
    for bad in ({**args, "definition": {"max-length": -3}}, {**args, "apply_to": "streams"},
                {**args, "definition": {"unknown-key": 1}}):
        try:
            await view.run_command("set_policy", bad)
        except CommandError as err:
            assert err.status == 400
        else:
            raise AssertionError(f"accepted {bad}")
    assert cluster.mirrored.policies[("/", "cap")].definition == {"max-length": 3}
    await view.run_command("clear_policy", {"vhost": "/", "name": "cap"})
    assert ("/", "cap") not in cluster.mirrored.policies
    try:
        await view.run_command("clear_policy", {"vhost": "/", "name": "cap"})
    except CommandError as err:
        assert err.status == 404
    else:
        raise AssertionError("cleared a missing policy")


def test_metadata_policies_are_mirrored_as_broker_records_both_ways() -> None:
    old = md.MetadataState()
    new, _ = md.apply(old, md.PutVhost("/"))
    policy = md.PolicyRecord("/", "cap", "^q", "queues", {"max-length": 3}, 2)
    with_policy, outcome = md.apply(new, md.SetPolicy(policy))
    assert outcome.ok
    records = cluster_defs.mirror_records(new, with_policy)
    assert records == [PolicyRecord("/", "cap", "^q", "queues", {"max-length": 3}, 2)]
    cleared, _ = md.apply(with_policy, md.ClearPolicy("/", "cap"))
    assert cluster_defs.mirror_records(with_policy, cleared) == [PolicyRecord("/", "cap", "^q", "queues",
                                                                              {"max-length": 3}, 2, deleted=True)]
    commands = cluster_defs.commands_for([*records, PolicyRecord("/", "cap", deleted=True)], with_policy,
                                         lambda *a: ("n1", ("n1",)))
    assert commands == [md.SetPolicy(policy), md.ClearPolicy("/", "cap")]
