"""The three-cluster federation ring scenario (chaos/federation_ring.py, chaos/scenarios/federation-ring-kill.toml),
pure parts: the bundled scenario's shape and settings, and the ring checker on made-up histories (a message
expected at all three clusters, lost at one, copied, or back at its origin through federation). The scenario
itself runs with `raftmq chaos run federation-ring-kill` (three 3-node clusters, a few minutes: not in CI);
docs/chaos.md has the verdicts of full runs.
"""

from __future__ import annotations

import pytest

from chaos.federation_ring import RingSettings, check_ring, queue_of, upstream_of
from chaos.history import Delivery, Publish
from chaos.scenario import ScenarioError, load_scenario


def _pub(origin: str, n: int, outcome: str = "confirmed") -> Publish:
    return Publish("p0", n, f"run-{origin}-p0-{n}", queue_of(origin), outcome, float(n))  # type: ignore[arg-type]


def _got(origin: str, n: int, at: str, redelivered: bool = False) -> Delivery:
    return Delivery(f"run-{origin}-p0-{n}", "c0-0", queue_of(at), redelivered, 100.0 + n)


def test_the_bundled_ring_scenario_needs_nothing_but_itself() -> None:
    scenario = load_scenario("federation-ring-kill")
    assert scenario.federation_ring is not None and scenario.two_clusters and scenario.needs() == set()
    settings = RingSettings.parse(scenario.federation_ring)
    assert settings.nodes == [3, 3, 3] and settings.max_hops == 2 and settings.ack_mode == "on-confirm"
    assert {(s.action, s.target) for s in scenario.steps if s.action in ("kill", "restart")} == {
        ("kill", "b.link-node"), ("restart", "down")}
    assert {s.proxy for s in scenario.steps if s.action.startswith("toxic")} == {"fed-b-rmq1,fed-b-rmq2,fed-b-rmq3"}
    assert [upstream_of(side) for side in "abc"] == ["c", "a", "b"]
    with pytest.raises(ScenarioError):
        RingSettings.parse({"node": [3, 3, 3]})  # misspelt keys are refused, not ignored
    with pytest.raises(ScenarioError):
        RingSettings.parse({"nodes": [3, 3]})


def test_every_confirmed_message_is_expected_once_at_each_cluster() -> None:
    publishes = [_pub("a", 1), _pub("b", 2), _pub("c", 3, "unknown")]
    deliveries = [_got("a", 1, at) for at in "abc"] + [_got("b", 2, at) for at in "abc"] + [_got("c", 3, "c")]
    ring = check_ring(publishes, deliveries)
    assert ring.valid and ring.result.ok == 6 and ring.looped == () and ring.messages == 3
    assert ring.result.recovered == ("run-c-p0-3@c",) and len(ring.result.unconfirmed_absent) == 2
    assert ring.copies == {"a": {1: 2}, "b": {1: 2}, "c": {1: 3}}


def test_a_message_missing_at_one_cluster_is_lost_and_copies_are_counted_not_failed() -> None:
    publishes = [_pub("a", 1), _pub("a", 2)]
    deliveries = [_got("a", 1, "a"), _got("a", 1, "b"), _got("a", 1, "b"), _got("a", 1, "c"),  # a link's copy at B
                  _got("a", 2, "a"), _got("a", 2, "b")]  # never reached C
    ring = check_ring(publishes, deliveries)
    assert not ring.valid and ring.result.lost == ("run-a-p0-2@c",) and ring.looped == ()
    assert ring.copies["b"] == {2: 1, 1: 1} and ring.result.duplicated == (("run-a-p0-1@b", 2),)
    assert check_ring(publishes[:1], deliveries[:4]).valid  # duplicates alone do not fail the run


def test_a_second_unflagged_copy_at_the_origin_is_a_loop() -> None:
    publishes = [_pub("b", 1)]
    once = [_got("b", 1, at) for at in "abc"]
    assert check_ring(publishes, [*once, _got("b", 1, "b", redelivered=True)]).valid  # a consumer's redelivery
    looped = check_ring(publishes, [*once, _got("b", 1, "b")])  # came round the ring back to B
    assert not looped.valid and looped.looped == ("run-b-p0-1",)
