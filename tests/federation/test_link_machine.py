"""The exchange link machine (cluster/federation/link.py): x-received-from, loop safety (max-hops, cluster seen),
ack modes, binding diffs, reconnects."""

from __future__ import annotations

from cluster.federation.link import (
    RUNNING,
    STARTING,
    Ack,
    Bind,
    Connect,
    Disconnect,
    ExchangeLink,
    Nack,
    Publish,
    Unbind,
    freeze_args,
    thaw_args,
    upstream_queue_name,
)
from cluster.federation.params import parse_upstream
from node.amqp.properties import BasicProperties

URI = "amqp://u:secret@up-host:5672"


def _link(**extra: object) -> ExchangeLink:
    link = ExchangeLink(parse_upstream("/", "up", {"uri": URI, **extra}), "/", "x", "down-cluster")
    assert link.start(0) == [Connect(0)]
    return link


def test_queue_name_is_rabbitmqs() -> None:
    assert upstream_queue_name("x", "c1", "x") == "federation: x -> c1"
    assert upstream_queue_name("up-x", "c1", "x") == "federation: up-x -> c1:x"
    assert _link(exchange="up-x").queue_name == "federation: up-x -> down-cluster:x"


def test_forward_appends_received_from_and_acks_on_confirm() -> None:
    link = _link()
    assert link.connected(1, "up-cluster") == []
    assert link.state == RUNNING
    effects = link.delivery(7, "k", BasicProperties(user_id="guest", headers={"a": 1}), b"m", False)
    assert len(effects) == 1 and isinstance(effects[0], Publish)
    pub = effects[0]
    assert (pub.seq, pub.routing_key, pub.body) == (1, "k", b"m")
    assert pub.properties.user_id is None  # trust-user-id false
    assert pub.properties.headers == {"a": 1, "x-received-from": [
        {"uri": "amqp://u@up-host:5672/%2F", "exchange": "x", "redelivered": False, "cluster-name": "up-cluster"}]}
    assert link.confirm(1, False, True) == [Ack(7)]
    link.delivery(8, "k", BasicProperties(), b"m", True)
    link.delivery(9, "k", BasicProperties(), b"m", False)
    assert link.confirm(3, True, False) == [Nack(8), Nack(9)]


def test_loop_safety() -> None:
    link = _link()
    link.connected(1, "up-cluster")
    one_hop = BasicProperties(headers={"x-received-from": [{"cluster-name": "elsewhere"}]})
    assert link.delivery(1, "k", one_hop, b"", False) == [Ack(1)]  # max-hops 1 reached: acked, dropped
    link2 = _link(**{"max-hops": 3})
    link2.connected(1, "up-cluster")
    seen = BasicProperties(headers={"x-received-from": [{"cluster-name": b"down-cluster"}]})
    assert link2.delivery(1, "k", seen, b"", False) == [Ack(1)]  # names this cluster
    fresh = link2.delivery(2, "k", one_hop, b"", False)
    assert isinstance(fresh[0], Publish)
    assert [h["cluster-name"] for h in fresh[0].properties.headers["x-received-from"]] == ["up-cluster",
                                                                                            "elsewhere"]
    assert (link.dropped, link2.dropped, link2.forwarded) == (1, 1, 1)


def test_ack_modes() -> None:
    link = _link(**{"ack-mode": "on-publish", "trust-user-id": True})
    link.connected(1, "c")
    effects = link.delivery(3, "k", BasicProperties(user_id="guest"), b"", False)
    assert isinstance(effects[0], Publish) and effects[0].seq == 0 and effects[0].properties.user_id == "guest"
    assert effects[1:] == [Ack(3)]
    link = _link(**{"ack-mode": "no-ack"})
    link.connected(1, "c")
    assert len(link.delivery(3, "k", BasicProperties(), b"", False)) == 1
    assert link.delivery(4, "k", BasicProperties(headers={"x-received-from": [{}]}), b"", False) == []


def _from(*entries: tuple[str, int], **args: object) -> tuple[tuple[str, object], ...]:
    """Frozen binding arguments with an `x-bound-from` of (cluster-name, hops) entries (vhost "/", exchange x)."""
    bound = [{"cluster-name": c, "vhost": "/", "exchange": "/:x", "hops": h} for c, h in entries]
    return freeze_args({**args, "x-bound-from": bound})


def test_bindings_diff_and_replay_after_reconnect() -> None:
    link = _link()
    assert link.bindings({("a", ()), ("b", ())}) == []  # not running yet: kept for the connect
    mine = _from(("down-cluster", 1))  # a binding made here goes upstream with hops = max-hops
    assert sorted(link.connected(1, "c"), key=repr) == [Bind("a", mine), Bind("b", mine)]
    assert link.bindings({("b", ()), ("c", (("x-match", "all"),))}) == [
        Bind("c", _from(("down-cluster", 1), **{"x-match": "all"})), Unbind("a", mine)]
    assert link.bindings({("b", ()), ("c", (("x-match", "all"),))}) == []
    assert link.down("upstream: connection closed", 10) == [Disconnect("upstream: connection closed")]
    assert link.state == STARTING and link.status()["status"] == "error"
    assert link.tick(10 + 4999) == [] and link.tick(10 + 5000) == [Connect(0)]
    assert len(link.connected(6000, "c")) == 2  # every binding again on the new connection
    assert link.stop("removed", 7000) == [Disconnect("removed")]
    assert link.connect_failed("refused", 7001) == [] and link.delivery(1, "k", BasicProperties(), b"", False) == []


def test_x_bound_from_hops_as_rabbitmq() -> None:
    """rabbit_federation_exchange_link:update_binding: hops = min(previous - 1, max-hops); none at 0 or when the
    upstream is already in x-bound-from; the new entry goes first."""
    link = _link(**{"max-hops": 3})
    relayed = _from(("far", 2), ("farther", 3))  # a binding another cluster's link made here, hops 2 left
    seen = _from(("up-cluster", 3))  # made here by the upstream's own link: not sent back
    spent = _from(("far", 1))  # no hop left
    effects = link.connected(1, "up-cluster")
    assert effects == []
    effects = link.bindings({("k", ()), ("r", relayed), ("s", seen), ("z", spent)})
    assert effects == [Bind("k", _from(("down-cluster", 3))),
                       Bind("r", _from(("down-cluster", 1), ("far", 2), ("farther", 3)))]
    assert thaw_args(_from(("down-cluster", 1))) == {"x-bound-from": [
        {"cluster-name": "down-cluster", "exchange": "/:x", "hops": 1, "vhost": "/"}]}
    assert link.bindings({("k", ())}) == [Unbind("r", _from(("down-cluster", 1), ("far", 2), ("farther", 3)))]
    link1 = _link()  # max-hops 1 caps what a relayed binding has left
    link1.connected(1, "up-cluster")
    assert link1.bindings({("k", ()), ("r", _from(("far", 3))), ("z", spent)}) == [
        Bind("k", _from(("down-cluster", 1))), Bind("r", _from(("down-cluster", 1), ("far", 3)))]


def test_upstream_exchange_type_filter() -> None:
    """The routing rule of an `x-federation-upstream` exchange (RabbitMQ's plugin declares one upstream)."""
    from cluster.federation.link import upstream_exchange_routes

    args = {"x-max-hops": 2, "x-downstream-name": "down", "x-downstream-vhost": "/"}
    assert upstream_exchange_routes(args, None)
    assert upstream_exchange_routes(args, {"x-received-from": [{"cluster-name": "other", "vhost": "/"}]})
    assert not upstream_exchange_routes(args, {"x-received-from": [{"cluster-name": b"down", "vhost": b"/"}]})
    assert upstream_exchange_routes(args, {"x-received-from": [{"cluster-name": "down", "vhost": "v2"}]})
    assert not upstream_exchange_routes(args, {"x-received-from": [{"cluster-name": "a"}, {"cluster-name": "b"}]})
    assert not upstream_exchange_routes({"x-downstream-name": "down"}, {"x-received-from": [{"cluster-name": "x"}]})


def test_a_multiple_confirm_is_one_multiple_ack_upstream() -> None:
    link = _link()
    link.connected(1, "up-cluster")
    for tag in (5, 6, 7, 8):
        link.delivery(tag, "k", BasicProperties(), b"m", False)
    assert link.confirm(3, True, True) == [Ack(7, multiple=True)]  # tags 5, 6, 7
    assert link.confirm(4, True, True) == [Ack(8)]
