"""ReadyPipeline helpers: the late messages of several Readies leave as one frame per peer, in order."""

from __future__ import annotations

from cluster.raft.core.multiraft import NodeBatch
from cluster.raft.core.types import AppendResp, GroupId, Index, NodeId, Term
from cluster.raft.runtime.ready_pipeline import merge_batches

ME, A, B = NodeId("n1"), NodeId("n2"), NodeId("n3")


def _resp(dst: NodeId, index: int) -> tuple[GroupId, AppendResp]:
    return GroupId("g"), AppendResp(ME, dst, Term(1), Index(index))


def test_one_frame_per_peer_keeping_each_peers_order() -> None:
    batches = [NodeBatch(ME, A, 7, (_resp(A, 1),)), NodeBatch(ME, B, 7, (_resp(B, 1),)),
               NodeBatch(ME, A, 7, (_resp(A, 2), _resp(A, 3))), NodeBatch(ME, B, 7, ())]
    merged = merge_batches(batches)
    assert [batch.dst for batch in merged] == [A, B]
    assert [message.index for _, message in merged[0].messages] == [1, 2, 3]  # type: ignore[attr-defined]
    assert [message.index for _, message in merged[1].messages] == [1]  # type: ignore[attr-defined]
    assert all(batch.incarnation == 7 and batch.src == ME for batch in merged)


def test_an_empty_heartbeat_batch_still_goes_and_big_ones_are_split() -> None:
    assert merge_batches([NodeBatch(ME, A, 1, ()), NodeBatch(ME, A, 1, ())]) == [NodeBatch(ME, A, 1, ())]
    single = [NodeBatch(ME, A, 1, (_resp(A, 1),))]
    assert merge_batches(single) == single
    many = [NodeBatch(ME, A, 1, tuple(_resp(A, i) for i in range(3))) for _ in range(3)]
    assert [len(batch.messages) for batch in merge_batches(many, messages_max=4)] == [4, 4, 1]
