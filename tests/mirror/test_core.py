"""The pure mirror core on its own: ISR, HW and confirms, min_insync nacks, fetch and epoch-end replies, KIP-279's
truncation rounds, crash images, and the controller's election rules."""

from __future__ import annotations

from dataclasses import replace

from cluster.mirror_queues.core import controller as ctl
from cluster.mirror_queues.core.replica import Replica
from cluster.mirror_queues.core.types import (
    Confirmed,
    Effect,
    EpochEndRequest,
    EpochEndResponse,
    FetchRequest,
    FetchResponse,
    IsrChanged,
    Nacked,
    Record,
    Send,
    Settings,
    Truncated,
)


def leader_of(names: tuple[str, ...], settings: Settings, now: int = 0) -> Replica:
    leader = Replica(names[0], settings)
    leader.become_leader(0, frozenset(names), now)
    return leader


def reply(effects: list[Effect]) -> FetchResponse | EpochEndResponse:
    sends = [e for e in effects if isinstance(e, Send)]
    assert len(sends) == 1
    message = sends[0].message
    assert isinstance(message, FetchResponse | EpochEndResponse)
    return message


def test_confirm_waits_for_every_isr_member_and_consumers_see_below_hw() -> None:
    a = leader_of(("a", "b"), Settings())
    assert a.publish("m0") == []
    assert a.committed() == []
    effects = a.handle(FetchRequest("b", 0, 0), 0)
    resp = reply(effects)
    assert isinstance(resp, FetchResponse) and resp.records == (Record(0, 0, "m0"),) and resp.leader_hw == 0
    assert Confirmed("m0", 0) in a.handle(FetchRequest("b", 0, 1), 0)
    assert [r.msg for r in a.committed()] == ["m0"]


def test_lagging_follower_leaves_the_isr_then_rejoins_when_caught_up() -> None:
    s = Settings(replica_lag_max_ms=1_000)
    a = leader_of(("a", "b"), s)
    a.publish("m0")
    effects = a.tick(1_001)
    assert IsrChanged("a", 0, frozenset({"a"})) in effects
    assert Confirmed("m0", 0) in effects  # the HW moves with the smaller ISR
    a.handle(FetchRequest("b", 0, 0), 1_100)
    assert a.isr == {"a"}
    assert IsrChanged("a", 0, frozenset({"a", "b"})) in a.handle(FetchRequest("b", 0, 1), 1_200)


def test_min_insync_refuses_before_append_and_nacks_pending_when_the_isr_shrinks() -> None:
    s = Settings(min_insync=2, replica_lag_max_ms=1_000)
    a = leader_of(("a", "b"), s)
    a.publish("m0")
    effects = a.tick(2_000)
    assert Nacked("m0", "isr-below-min") in effects
    assert a.publish("m1") == [Nacked("m1", "not-enough-replicas")]
    assert a.leo == 1 and a.hw == 0  # the HW does not move while the ISR is below min_insync


def test_fetch_from_another_epoch_is_ignored_and_beyond_leo_is_out_of_range() -> None:
    a = leader_of(("a", "b"), Settings())
    assert a.handle(FetchRequest("b", 7, 0), 0) == []
    resp = reply(a.handle(FetchRequest("b", 0, 5), 0))
    assert isinstance(resp, FetchResponse) and resp.out_of_range and resp.leader_leo == 0


def test_a_new_leader_records_its_epoch_at_its_leo() -> None:
    r = Replica("a", Settings())
    r.log = [Record(0, 0, "m0"), Record(1, 0, "m1")]
    r.epochs = [(0, 0)]
    r.become_leader(3, frozenset({"a"}), 0)
    assert r.epochs == [(0, 0), (3, 2)]
    assert r.end_offset_for(0) == (0, 2)
    assert r.end_offset_for(2) == (0, 2)
    assert r.end_offset_for(3) == (3, 2)


def test_kip279_follower_lacking_the_leaders_epoch_truncates_and_asks_again() -> None:
    leader = Replica("a", Settings())
    leader.log = [Record(0, 0, "x0"), Record(1, 2, "x1"), Record(2, 2, "x2")]
    leader.epochs = [(0, 0), (2, 1)]
    leader.become_leader(4, frozenset({"a", "b"}), 0)
    b = Replica("b", Settings())
    b.log = [Record(0, 0, "x0"), Record(1, 1, "y1"), Record(2, 3, "y2"), Record(3, 3, "y3")]
    b.epochs = [(0, 0), (1, 1), (3, 2)]
    b.become_follower("a", 4)
    question = b.poll()
    assert question == [Send("a", EpochEndRequest("b", 4, 3))]
    answer = reply(leader.handle(EpochEndRequest("b", 4, 3), 0))
    assert answer == EpochEndResponse("a", 4, 2, 3)
    # b never had epoch 2: cut to the end of its epoch 1 and ask about epoch 1
    assert b.handle(answer, 0) == [Truncated("b", 4, 2, "leader-epoch (another round)")]
    assert b.truncating and b.asked_epoch == 1
    answer = reply(leader.handle(EpochEndRequest("b", 4, 1), 0))
    assert answer == EpochEndResponse("a", 4, 0, 1)
    assert b.handle(answer, 0) == [Truncated("b", 2, 1, "leader-epoch")]
    assert not b.truncating and [r.msg for r in b.log] == ["x0"]


def test_hw_truncation_cuts_to_the_hw_at_once() -> None:
    b = Replica("b", Settings(truncation="hw"))
    b.log = [Record(0, 0, "m0"), Record(1, 0, "m1")]
    b.epochs = [(0, 0)]
    b.hw = 1
    assert b.become_follower("a", 1) == [Truncated("b", 2, 1, "hw (unsafe)")]


def test_a_crash_keeps_the_flushed_prefix_and_the_hw_checkpoint() -> None:
    s = Settings(flush="unsynced", hw_checkpoint_interval_ms=100)
    a = leader_of(("a",), s)
    a.publish("m0")
    a.flush()
    a.publish("m1")
    a.tick(100)
    assert a.hw == 2 and a.hw_checkpoint == 2
    back = Replica.recover("a", s, a.crash_image(), 200)
    assert [r.msg for r in back.log] == ["m0"] and back.hw == 1 and back.hw_checkpoint == 2


def test_controller_elects_from_the_isr_only_unless_always() -> None:
    s = Settings()
    state = ctl.alter_isr(ctl.initial(("a", "b")), IsrChanged("a", 0, frozenset({"a"})), s)
    down = ctl.broker_down(state, "a", frozenset({"b"}), s, {})
    assert down.leader is None and down.epoch == 0
    unclean = ctl.broker_down(state, "a", frozenset({"b"}), Settings(promote_on_failure="always"), {})
    assert unclean.leader == "b" and unclean.epoch == 1 and unclean.unclean_elections == 1
    back = ctl.broker_up(down, "a", frozenset({"a", "b"}), False, s, {})
    assert back.leader == "a" and back.epoch == 1


def test_a_replica_reporting_itself_up_to_a_queue_without_a_leader_is_elected_first() -> None:
    """The reporter is surely live; another ISR member first in replica order is live only as far as it knows
    (a paused node, killed since: electing it left the queue without a leader in the broker scenario)."""
    s = Settings()
    state = ctl.broker_down(ctl.initial(("a", "b")), "a", frozenset(), s, {})  # nobody live to elect
    assert state.leader is None and state.isr == frozenset({"a", "b"})
    up = ctl.broker_up(state, "b", frozenset({"a", "b"}), False, s, {})
    assert (up.leader, up.epoch, up.isr) == ("b", 1, frozenset({"a", "b"}))
    out_of_sync = ctl.broker_up(replace(state, isr=frozenset({"a"})), "b", frozenset({"a", "b"}), False, s, {})
    assert out_of_sync.leader == "a"  # (only the eligible are preferred)


def test_controller_keeps_replicas_dropped_below_min_insync_eligible() -> None:
    s = Settings(min_insync=2)
    state = ctl.initial(("a", "b", "c"))
    state = ctl.alter_isr(state, IsrChanged("a", 0, frozenset({"a", "b"})), s)
    assert state.elr == frozenset()
    state = ctl.alter_isr(state, IsrChanged("a", 0, frozenset({"a"})), s)
    assert state.elr == frozenset({"b"})
    elected = ctl.broker_down(state, "a", frozenset({"b", "c"}), s, {})
    assert elected.leader == "b" and elected.epoch == 1


def test_controller_waits_for_every_unclean_member_then_takes_the_longest_log() -> None:
    s = Settings(flush="unsynced")
    state = ctl.broker_down(ctl.initial(("a", "b")), "a", frozenset(), s, {})
    state = ctl.broker_up(state, "b", frozenset({"b"}), True, s, {"b": (0, 1)})
    assert state.leader is None and state.unclean == frozenset({"b"})
    state = ctl.broker_up(state, "a", frozenset({"a", "b"}), True, s, {"a": (0, 2), "b": (0, 1)})
    assert state.leader == "a" and state.unclean == frozenset({"b"})
    state = ctl.alter_isr(state, IsrChanged("a", 1, frozenset({"a", "b"})), s)
    assert state.unclean == frozenset()


def test_controlled_transfer_goes_to_a_live_isr_member_only() -> None:
    state = ctl.initial(("a", "b", "c"))
    assert ctl.transfer(state, "b", frozenset({"a", "c"})) == state
    moved = ctl.transfer(state, "b", frozenset({"a", "b", "c"}))
    assert moved.leader == "b" and moved.epoch == 1 and moved.isr == state.isr
