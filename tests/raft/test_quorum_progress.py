"""Quorum math and progress tracking against deliberately naive reference implementations."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from cluster.raft.core.progress import Inflights, Progress, ProgressState
from cluster.raft.core.quorum import VoteResult, committed_index, vote_result
from cluster.raft.core.types import Index, NodeId

NODES = [NodeId(f"n{i}") for i in range(7)]


def naive_committed_index(voters: set[NodeId], match: dict[NodeId, Index]) -> int:
    """Try every candidate index; keep the largest one that more than half of the voters have reached."""
    best = 0
    for candidate in range(0, max(match.values(), default=0) + 1):
        reached = sum(1 for voter in voters if match.get(voter, 0) >= candidate)
        if reached * 2 > len(voters):
            best = candidate
    return best


def naive_vote_result(voters: set[NodeId], votes: dict[NodeId, bool]) -> VoteResult:
    """Enumerate every way the missing votes could still go."""
    missing = [voter for voter in voters if voter not in votes]
    outcomes = set()
    for fill in itertools.product([True, False], repeat=len(missing)):
        full = {voter: votes[voter] for voter in voters if voter in votes} | dict(zip(missing, fill, strict=True))
        outcomes.add(sum(full.values()) * 2 > len(voters))
    if outcomes == {True}:
        return VoteResult.WON
    if outcomes == {False}:
        return VoteResult.LOST
    return VoteResult.PENDING


@given(st.sets(st.sampled_from(NODES), min_size=1), st.dictionaries(st.sampled_from(NODES), st.integers(0, 20)))
def test_committed_index_matches_naive(voters: set[NodeId], match: dict[NodeId, int]) -> None:
    typed = {node: Index(value) for node, value in match.items()}
    assert committed_index(voters, typed) == naive_committed_index(voters, typed)


@given(st.sets(st.sampled_from(NODES), min_size=1), st.dictionaries(st.sampled_from(NODES), st.booleans()))
def test_vote_result_matches_naive(voters: set[NodeId], votes: dict[NodeId, bool]) -> None:
    assert vote_result(voters, votes) is naive_vote_result(voters, votes)


def test_committed_index_of_empty_voters_is_zero() -> None:
    assert committed_index(set(), {}) == 0


@given(st.lists(st.tuples(st.integers(1, 5), st.integers(1, 300)), max_size=40), st.integers(0, 60))
def test_inflights_bound_and_free_match_a_list(sends: list[tuple[int, int]], free_through: int) -> None:
    inflights = Inflights(count_max=8, size_bytes_max=1_000)
    reference: list[tuple[int, int]] = []
    last = 0
    for step, size in sends:
        if inflights.full():
            assert len(reference) >= 8 or sum(s for _, s in reference) >= 1_000
            break
        last += step
        inflights.add(Index(last), size)
        reference.append((last, size))
    inflights.free_through(Index(free_through))
    reference = [(index, size) for index, size in reference if index > free_through]
    assert len(inflights) == len(reference)
    assert inflights.size_bytes == sum(size for _, size in reference)


def _progress() -> Progress:
    return Progress(Index(0), Index(11), Inflights(4, 1 << 20))


def test_probe_sends_one_append_then_waits() -> None:
    pr = _progress()
    assert not pr.is_paused()
    pr.sent_entries(Index(12), 10)
    assert pr.is_paused() and pr.next == 11  # probe does not advance next optimistically


def test_replicate_pipelines_until_inflights_are_full() -> None:
    pr = _progress()
    pr.maybe_update(Index(10))
    pr.become_replicate()
    for last in range(12, 16):
        assert not pr.is_paused()
        pr.sent_entries(Index(last), 10)
    assert pr.is_paused() and pr.next == 16
    pr.maybe_update(Index(13))
    pr.inflights.free_through(Index(13))
    assert not pr.is_paused()


def test_stale_rejections_are_ignored_and_next_never_drops_below_match() -> None:
    pr = _progress()
    pr.maybe_update(Index(5))
    assert pr.state is ProgressState.PROBE
    assert not pr.maybe_decrease_to(Index(3), Index(0))  # not the outstanding probe: stale
    assert pr.maybe_decrease_to(Index(10), Index(2))
    assert pr.next == 6  # match + 1, not hint + 1
    pr.become_replicate()
    assert not pr.maybe_decrease_to(Index(4), Index(0))  # at or below match: stale
