"""Majority arithmetic: the committed index of a voter set and the outcome of an election.

`committed_index` sorts the voters' match indexes and takes the one a majority has reached; `vote_result`
counts grants and rejections against the majority. Both are tested against naive reference versions.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Set

from cluster.raft.core.types import Index, NodeId


class VoteResult(enum.Enum):
    PENDING = "pending"
    WON = "won"
    LOST = "lost"


def majority(voter_count: int) -> int:
    return voter_count // 2 + 1


def committed_index(voters: Set[NodeId], match: Mapping[NodeId, Index]) -> Index:
    """The largest index that a majority of `voters` has matched (missing voters count as 0)."""
    if not voters:
        return Index(0)
    ordered = sorted((match.get(voter, Index(0)) for voter in voters), reverse=True)
    return ordered[majority(len(voters)) - 1]


def vote_result(voters: Set[NodeId], votes: Mapping[NodeId, bool]) -> VoteResult:
    granted = sum(1 for voter in voters if votes.get(voter) is True)
    rejected = sum(1 for voter in voters if votes.get(voter) is False)
    needed = majority(len(voters))
    if granted >= needed:
        return VoteResult.WON
    if len(voters) - rejected < needed:
        return VoteResult.LOST
    return VoteResult.PENDING
