"""The management API served in-process over a real Broker, spoken to over real TCP sockets."""

from __future__ import annotations

from urllib.parse import unquote

import trio

from node.amqp import methods as m
from node.broker.auth import Permission
from node.broker.broker import Broker, BrokerConfig
from node.broker.effects import CloseConnection, Persist
from node.broker.records import PermissionRecord, UserRecord, from_cbor, to_cbor
from node.runtime.management import ManagementLimits
from node.runtime.management_api import needs_read_barrier
from node.runtime.management_http import RequestHead
from tests.broker.harness import Client, new_broker, persists
from tests.management.helpers import auth_header, raw_exchange, request, served_broker, split_response


async def test_overview_and_nodes_name_this_node() -> None:
    async with served_broker() as s:
        status, headers, body = await request(s.port, "GET", "/api/overview")
        assert status == 200 and headers["content-type"] == "application/json"
        assert body["node"] == "rabbit@test" and body["object_totals"]["queues"] == 0
        status, _, nodes = await request(s.port, "GET", "/api/nodes")
        assert status == 200 and [n["name"] for n in nodes] == ["rabbit@test"] and nodes[0]["running"]
        status, _, me = await request(s.port, "GET", "/api/whoami")
        assert me == {"name": "guest", "tags": ["administrator"]}


async def test_login_required_and_each_path_needs_rabbitmqs_tag() -> None:
    async with served_broker() as s:
        status, headers, body = await request(s.port, "GET", "/api/overview", user=None)
        assert status == 401 and headers["www-authenticate"].startswith("Basic")
        assert body == {"error": "not_authorised", "reason": "Login failed"}
        status, _, _ = await request(s.port, "GET", "/api/overview", password="wrong")
        assert status == 401
        s.broker.add_user("bob", "pw", ())
        status, _, body = await request(s.port, "GET", "/api/overview", user="bob", password="pw")
        assert status == 401 and body["reason"] == "Not management user"  # RabbitMQ's tag for the overview
        s.broker.add_user("bob", "pw", ("management",))
        status, _, _ = await request(s.port, "GET", "/api/overview", user="bob", password="pw")
        assert status == 200
        status, _, body = await request(s.port, "GET", "/api/users", user="bob", password="pw")
        assert status == 401 and body["reason"] == "Not administrator user"
        status, _, body = await request(s.port, "GET", "/api/nodes", user="bob", password="pw")
        assert status == 401 and body["reason"] == "Not monitor user"
        status, _, body = await request(s.port, "GET", "/api/policies", user="bob", password="pw")
        assert status == 401 and body["reason"] == "User not authorised to access object"


async def test_put_user_and_permissions_hand_persist_effects_to_the_runtime() -> None:
    async with served_broker() as s:
        status, _, _ = await request(s.port, "PUT", "/api/users/alice",
                                     {"password": "s3cret", "tags": "administrator,monitoring"})
        assert status == 201
        status, _, _ = await request(s.port, "PUT", "/api/users/alice", {"password": "s3cret", "tags": ["administrator"]})
        assert status == 204  # updated, as RabbitMQ answers
        records = [r for e in s.emitted if isinstance(e, Persist) for r in e.records]
        assert [type(r) for r in records] == [UserRecord, UserRecord]
        assert records[0].tags == ("administrator", "monitoring")
        status, _, user = await request(s.port, "GET", "/api/users/alice", user="alice", password="s3cret")
        assert status == 200 and user["tags"] == ["administrator"]
        status, _, _ = await request(s.port, "PUT", "/api/permissions/%2F/alice",
                                     {"configure": "^a", "write": ".*", "read": ""})
        assert status == 201
        assert PermissionRecord("alice", "/", "^a", ".*", "") in [r for e in s.emitted if isinstance(e, Persist)
                                                                   for r in e.records]
        status, _, perm = await request(s.port, "GET", "/api/permissions/%2F/alice")
        assert perm == {"user": "alice", "vhost": "/", "configure": "^a", "write": ".*", "read": ""}
        status, _, body = await request(s.port, "PUT", "/api/permissions/nope/alice",
                                        {"configure": ".*", "write": ".*", "read": ".*"})
        assert status == 400 and "vhost_not_found" in body["reason"]
        status, _, body = await request(s.port, "PUT", "/api/users/carol", {"tags": "x"})
        assert status == 400 and "password" in body["reason"]


async def test_async_effect_callback_is_awaited_before_answering() -> None:
    done: list[str] = []

    async def apply_slowly(effects: list[object]) -> None:
        await trio.sleep(0)
        done.append("persisted")

    from node.broker.broker import Broker
    from node.runtime.management_view import BrokerView
    broker = Broker()
    view = BrokerView(broker, apply_slowly, node_name="n")
    async with served_broker(view=view) as s:
        status, _, _ = await request(s.port, "PUT", "/api/vhosts/v2")
        assert status == 201 and done == ["persisted"]
        assert "v2" in broker.vhosts


async def test_queues_exchanges_bindings_connections_consumers() -> None:
    async with served_broker() as s:
        client = Client(s.broker)
        client.open()
        client.declare("jobs", durable=True, arguments={"x-queue-type": "quorum", "x-max-length": 10})
        client.declare("other")
        client.bind("jobs", "amq.topic", "a.*")
        for n in range(3):
            client.publish("", "jobs", f"m{n}".encode())
        client.call(m.BasicQos(prefetch_count=1))
        client.consume("jobs", tag="ctag-1")  # takes one message unacked
        status, _, queues = await request(s.port, "GET", "/api/queues")
        assert status == 200 and [q["name"] for q in queues] == ["jobs", "other"]
        jobs = queues[0]
        assert jobs["type"] == "quorum" and jobs["durable"] and jobs["vhost"] == "/"
        assert (jobs["messages_ready"], jobs["messages_unacknowledged"], jobs["consumers"]) == (2, 1, 1)
        assert (jobs["messages_dlx"], jobs["message_bytes_dlx"]) == (0, 0)
        assert jobs["leader"] == "rabbit@test" and jobs["members"] == ["rabbit@test"]
        assert jobs["arguments"] == {"x-queue-type": "quorum", "x-max-length": 10}
        status, _, one = await request(s.port, "GET", "/api/queues/%2F/jobs")
        assert status == 200 and one["name"] == "jobs"
        status, _, _ = await request(s.port, "GET", "/api/queues/%2F/missing")
        assert status == 404
        status, _, in_vhost = await request(s.port, "GET", "/api/queues/%2F")
        assert len(in_vhost) == 2
        _, _, exchanges = await request(s.port, "GET", "/api/exchanges/%2F")
        assert {"", "amq.topic", "amq.direct"} <= {e["name"] for e in exchanges}
        _, _, bindings = await request(s.port, "GET", "/api/bindings")
        assert {"source": "amq.topic", "vhost": "/", "destination": "jobs", "destination_type": "queue",
                "routing_key": "a.*", "arguments": {}, "properties_key": "a.%2A"} in bindings  # RabbitMQ 3.10 quotes it
        assert any(b["source"] == "" and b["destination"] == "other" for b in bindings)
        _, _, conns = await request(s.port, "GET", "/api/connections")
        assert len(conns) == 1 and conns[0]["user"] == "guest" and conns[0]["channels"] == 1
        _, _, consumers = await request(s.port, "GET", "/api/consumers/%2F")
        assert [c["consumer_tag"] for c in consumers] == ["ctag-1"]
        assert consumers[0]["queue"] == {"name": "jobs", "vhost": "/"} and consumers[0]["prefetch_count"] == 1
        _, _, overview = await request(s.port, "GET", "/api/overview")
        assert overview["queue_totals"] == {"messages": 3, "messages_ready": 2, "messages_unacknowledged": 1}
        _, _, vhosts = await request(s.port, "GET", "/api/vhosts")
        assert vhosts[0]["name"] == "/" and vhosts[0]["messages"] == 3


async def test_cluster_commands_answer_not_in_a_cluster() -> None:
    async with served_broker() as s:
        for name, args in (("join_cluster", {"node": "rmq2"}), ("add_member", {"vhost": "/", "queue": "q",
                                                                               "node": "rmq2"}),
                           ("rebalance", {}), ("leave_cluster", {})):
            status, _, body = await request(s.port, "POST", f"/api/raftmq/{name}", args)
            assert status == 501 and body["reason"] == "not in a cluster", name
        status, _, body = await request(s.port, "POST", "/api/raftmq/grow", {"node": "rmq2"})
        assert status == 400 and "strategy" in body["reason"]
        status, _, _ = await request(s.port, "POST", "/api/raftmq/no_such_thing", {})
        assert status == 404
        status, _, policies = await request(s.port, "GET", "/api/policies")  # (policies: tests/policies)
        assert status == 200 and policies == []


async def test_bad_requests_are_refused_with_the_right_status() -> None:
    async with served_broker() as s:
        status, _, _ = split_response(await raw_exchange(s.port, b"NONSENSE\r\n\r\n"))
        assert status == 400
        status, _, _ = split_response(await raw_exchange(s.port, b"GET /api/overview HTTP/2.0\r\n\r\n"))
        assert status == 505
        status, _, _ = split_response(await raw_exchange(s.port, b"GET /api/overview HTTP/1.1\r\n\r\n"))
        assert status == 400  # HTTP/1.1 without Host, as RabbitMQ 3.10 (cowboy) answers
        huge = b"GET /api/overview HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n"
        status, _, _ = split_response(await raw_exchange(s.port, huge))
        assert status == 431
        status, _, _ = split_response(await raw_exchange(
            s.port, b"PUT /api/users/x HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n"))
        assert status == 413
        status, _, _ = split_response(await raw_exchange(
            s.port, b"PUT /api/users/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"))
        assert status == 411
        status, _, body = await request(s.port, "GET", "/nothing/here")
        assert status == 404
        status, _, body = await request(s.port, "POST", "/api/users/guest")  # (DELETE is served: 204)
        assert status == 405
        bad_json = (f"PUT /api/users/x HTTP/1.1\r\nHost: x\r\nAuthorization: {auth_header()}\r\nContent-Length: 3\r\n"
                    "Connection: close\r\n\r\n{{{").encode()
        status, _, body = split_response(await raw_exchange(s.port, bad_json))
        assert status == 400 and "JSON" in body["reason"]


async def test_the_internal_logins_names_are_refused_as_user_names() -> None:
    """`raftmq-internal-*` are the nodes' internal logins, checked before the user table: no user takes such a
    name, by PUT or by a definitions import (with a password or a hash); other names that merely contain it do."""
    async with served_broker() as s:
        for name in ("raftmq-internal-forward", "raftmq-internal-link", "raftmq-internal-"):
            status, _, body = await request(s.port, "PUT", f"/api/users/{name}", {"password": "pw", "tags": ""})
            assert status == 400 and body["error"] == "bad_request" and "reserved" in body["reason"], name
        for user in ({"name": "raftmq-internal-link", "password": "pw"},
                     {"name": "raftmq-internal-x", "password_hash": "aGFzaA==", "tags": ""}):
            status, _, body = await request(s.port, "POST", "/api/definitions", {"users": [user]})
            assert status == 400 and "reserved" in body["reason"], user
        status, _, body = await request(s.port, "POST", "/api/definitions", {"users": [
            {"name": "fine", "password": "pw"}, {"name": "raftmq-internal-y", "password": "pw"}]})
        assert status == 400 and "reserved" in body["reason"]  # refused before anything changed: no "fine"
        assert not [n for n in s.broker.users.users if n.startswith("raftmq-internal") or n == "fine"]
        assert not [e for e in s.emitted if isinstance(e, Persist)]
        status, _, _ = await request(s.port, "PUT", "/api/users/my-raftmq-internal-user", {"password": "pw"})
        assert status == 201


async def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    async with served_broker() as s:
        one = f"GET /api/whoami HTTP/1.1\r\nHost: x\r\nAuthorization: {auth_header()}\r\n\r\n".encode()
        last = f"GET /api/nodes HTTP/1.1\r\nHost: x\r\nAuthorization: {auth_header()}\r\nConnection: close\r\n\r\n".encode()
        raw = await raw_exchange(s.port, one + one + last)
        assert raw.count(b"HTTP/1.1 200 OK") == 3
        assert raw.rstrip().endswith(b"}]")


async def test_a_silent_client_is_dropped_with_408() -> None:
    async with served_broker(ManagementLimits(request_timeout_s=0.2)) as s:
        raw = await raw_exchange(s.port, b"GET /api/overview HTTP/1.1\r\nHost: x\r\n")  # head never finishes
        status, _, _ = split_response(raw)
        assert status == 408
        stream = await trio.open_tcp_stream("127.0.0.1", s.port)
        async with stream:  # an idle keep-alive connection is simply closed
            assert await stream.receive_some(100) == b""


async def test_connections_over_the_limit_get_503() -> None:
    async with served_broker(ManagementLimits(connections_max=1, request_timeout_s=5)) as s:
        holder = await trio.open_tcp_stream("127.0.0.1", s.port)
        async with holder:
            # A keep-alive request answered: the server now holds the only slot for this connection.
            await holder.send_all(f"GET /api/whoami HTTP/1.1\r\nHost: x\r\nAuthorization: {auth_header()}\r\n\r\n".encode())
            answer = b""
            while not answer.endswith(b"}"):
                answer += await holder.receive_some(4096)
            status, _, body = split_response(await raw_exchange(s.port, b""))
            assert status == 503 and body["reason"] == "too many connections"


async def test_metrics_parse_with_prometheus_client_and_need_no_login() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    async with served_broker() as s:
        client = Client(s.broker)
        client.open()
        client.declare('we"ird\\q', durable=True)
        for n in range(2):
            client.publish("", 'we"ird\\q', f"m{n}".encode())
        raw = await raw_exchange(s.port, b"GET /metrics/per-object HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and b"text/plain; version=0.0.4" in head
        samples = {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
                   for family in text_string_to_metric_families(body.decode()) for smp in family.samples}
        assert samples[("rabbitmq_queue_messages_ready", (("queue", 'we"ird\\q'), ("vhost", "/")))] == 2
        assert samples[("rabbitmq_connections", ())] == 1 and samples[("rabbitmq_queues", ())] == 1
        raw = await raw_exchange(s.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        aggregated = list(text_string_to_metric_families(raw.partition(b"\r\n\r\n")[2].decode()))
        ready = next(f for f in aggregated if f.name == "rabbitmq_queue_messages_ready")
        assert [(smp.labels, smp.value) for smp in ready.samples] == [({}, 2)]


async def test_a_management_user_sees_only_its_vhosts() -> None:
    async with served_broker() as s:
        from node.broker.auth import Permission

        s.broker.add_vhost("mine")
        s.broker.add_vhost("theirs")
        s.broker.add_user("m", "pw", ("management",))
        s.broker.set_permissions("m", "mine", Permission(".*", ".*", ".*"))
        status, _, vhosts = await request(s.port, "GET", "/api/vhosts", user="m", password="pw")
        assert status == 200 and [v["name"] for v in vhosts] == ["mine"]
        status, _, _ = await request(s.port, "GET", "/api/vhosts/theirs", user="m", password="pw")
        assert status == 404
        status, _, me = await request(s.port, "GET", "/api/whoami", user="m", password="pw")
        assert me == {"name": "m", "tags": ["management"]}


async def test_a_policymaker_changes_policies_and_parameters_only_in_its_vhosts() -> None:
    """As RabbitMQ: a policymaker needs permissions in the vhost of the policy or parameter, and in the vhost a
    shovel or upstream URI without a host (this node) names; an administrator is not asked."""
    async with served_broker() as s:
        s.broker.add_vhost("mine")
        s.broker.add_vhost("theirs")
        s.broker.add_user("p", "pw", ("policymaker",))
        s.broker.set_permissions("p", "mine", Permission(".*", ".*", ".*"))
        policy = {"pattern": ".*", "definition": {"max-length": 5}}
        as_p = {"user": "p", "password": "pw"}
        status, _, body = await request(s.port, "PUT", "/api/policies/theirs/x", policy, **as_p)
        assert status == 401 and body == {"error": "not_authorised",
                                          "reason": "User not authorised to access virtual host"}
        status, _, _ = await request(s.port, "PUT", "/api/policies/mine/x", policy, **as_p)
        assert status == 201
        status, _, _ = await request(s.port, "DELETE", "/api/policies/theirs/x", **as_p)
        assert status == 401

        def shovel(src: str) -> dict[str, object]:
            return {"value": {"src-uri": src, "src-queue": "q", "dest-uri": "amqp:///mine", "dest-queue": "d"}}

        status, _, body = await request(s.port, "PUT", "/api/parameters/shovel/mine/s", shovel("amqp:///theirs"),
                                        **as_p)
        assert status == 400 and "may not access vhost 'theirs'" in body["reason"]
        status, _, _ = await request(s.port, "PUT", "/api/parameters/shovel/theirs/s", shovel("amqp:///mine"), **as_p)
        assert status == 401
        upstream = {"value": {"uri": ["amqp://", "amqp:///mine"]}}  # amqp:// is the vhost "/"
        status, _, body = await request(s.port, "PUT", "/api/parameters/federation-upstream/mine/u", upstream, **as_p)
        assert status == 400 and "may not access vhost '/'" in body["reason"]
        status, _, _ = await request(s.port, "PUT", "/api/parameters/shovel/mine/s", shovel("amqp:///mine"), **as_p)
        assert status == 201
        status, _, _ = await request(s.port, "PUT", "/api/parameters/shovel/mine/s2", shovel("amqp://h/theirs"),
                                     **as_p)
        assert status == 201  # another broker's vhost: its own login decides
        status, _, _ = await request(s.port, "PUT", "/api/parameters/shovel/theirs/s", shovel("amqp:///theirs"))
        assert status == 201  # guest, an administrator


async def test_deleted_users_permissions_and_vhosts_stay_deleted_after_recovery() -> None:
    """DELETE of a user (its permissions and connections go too), of permissions and of a vhost (its queues,
    exchanges, bindings, policies and connections go too), as RabbitMQ 3.10; the stored records recover to the same
    state, and a vhost made again afterwards has its amq.* exchanges."""
    async with served_broker() as s:
        b = s.broker
        b.add_vhost("v")
        for user in ("ann", "bob"):
            b.add_user(user, "pw", ())
            b.set_permissions(user, "v", Permission(".*", ".*", ".*"))
        b.set_permissions("guest", "v", Permission(".*", ".*", ".*"))
        b.set_policy("v", "cap", "^q$", "queues", {"max-length": 5}, 0)
        stored = [r for p in persists(b.take_effects()) for r in p.records]
        ann = Client(b, conn_id=2, user="ann", vhost="v")
        stored += [r for p in persists(ann.open()) for r in p.records]
        stored += [r for p in persists(ann.declare("q", durable=True)) for r in p.records]
        stored += [r for p in persists(ann.call(m.ExchangeDeclare(exchange="x", type="fanout", durable=True)))
                   for r in p.records]
        stored += [r for p in persists(ann.bind("q", "x")) for r in p.records]
        assert "q" in b.vhosts["v"].queues and b.vhosts["v"].exchanges["x"].bindings
        assert (await request(s.port, "DELETE", "/api/users/ann"))[0] == 204
        assert (await request(s.port, "DELETE", "/api/users/ann"))[:3:2] == (404, {
            "error": "Object Not Found", "reason": "Not Found"})
        closes = [e for e in s.emitted if isinstance(e, CloseConnection)]
        assert [(c.conn_id, c.reply_code, c.reply_text) for c in closes] == [
            (2, 320, "CONNECTION_FORCED - user 'ann' is deleted")]
        assert "ann" not in b.users.users and ("ann", "v") not in b.users.permissions
        assert (await request(s.port, "DELETE", "/api/permissions/v/bob"))[0] == 204
        assert (await request(s.port, "DELETE", "/api/permissions/v/bob"))[0] == 404
        assert ("bob", "v") not in b.users.permissions and "bob" in b.users.users
        assert (await request(s.port, "DELETE", "/api/vhosts/v"))[0] == 204
        assert (await request(s.port, "DELETE", "/api/vhosts/v"))[0] == 404
        assert "v" not in b.vhosts and ("guest", "v") not in b.users.permissions
        stored += [r for e in s.emitted if isinstance(e, Persist) for r in e.records]
        fresh = new_broker()
        fresh.recover([from_cbor(to_cbor(r)) for r in stored])
        assert "v" not in fresh.vhosts and "ann" not in fresh.users.users and "bob" in fresh.users.users
        assert not [k for k in fresh.users.permissions if k[1] == "v" or k[0] == "ann"]
        again = Broker(BrokerConfig(durable_replies=False))
        again.recover([from_cbor(to_cbor(r)) for r in stored])
        again.add_vhost("v")
        stored += [r for p in persists(again.take_effects()) for r in p.records]
        fresh = new_broker()
        fresh.recover([from_cbor(to_cbor(r)) for r in stored])
        assert {"amq.direct", "amq.topic", "amq.rabbitmq.trace"} <= set(fresh.vhosts["v"].exchanges)
        assert not fresh.vhosts["v"].queues and "x" not in fresh.vhosts["v"].exchanges
        assert not fresh.vhosts["v"].policies


def test_which_requests_wait_for_the_metadata_read_barrier() -> None:
    """Definitions (reads and every change but a connection's close) wait; live state and peers' sub-requests never."""
    def head(method: str, path: str, query: dict[str, list[str]] | None = None) -> RequestHead:
        segments = tuple(unquote(s) for s in path.strip("/").split("/"))
        return RequestHead(method, path, segments, query or {}, "HTTP/1.1")

    waits = [("GET", "/api/users"), ("GET", "/api/users/u"), ("GET", "/api/permissions/%2F/u"),
             ("GET", "/api/policies/%2F/p"), ("GET", "/api/parameters/shovel"), ("GET", "/api/vhost-limits"),
             ("GET", "/api/user-limits/u"), ("GET", "/api/definitions"), ("GET", "/api/queues/%2F/q"),
             ("HEAD", "/api/exchanges"), ("GET", "/api/bindings/%2F"), ("GET", "/api/vhosts/v"),
             ("PUT", "/api/users/u"), ("DELETE", "/api/policies/%2F/p"), ("POST", "/api/definitions"),
             ("POST", "/api/raftmq/grow")]
    never = [("GET", "/api/overview"), ("GET", "/api/nodes"), ("GET", "/api/whoami"), ("GET", "/api/connections"),
             ("GET", "/api/channels"), ("GET", "/api/consumers"), ("GET", "/api/vhosts/v/channels"),
             ("GET", "/api/shovels"), ("GET", "/api/federation-links"), ("GET", "/api/healthchecks/node"),
             ("DELETE", "/api/connections/c")]
    assert [p for m, p in waits if not needs_read_barrier(head(m, p))] == []
    assert [p for m, p in never if needs_read_barrier(head(m, p))] == []
    assert not needs_read_barrier(head("GET", "/api/queues/%2F/q", {"raftmq_local": ["true"]}))
