"""The test-only `test_unsafe_confirm_before_commit` mode confirms publishes that Raft has not committed.

Three real nodes in that mode; the quorum queue's other two members are killed, so the remaining node can commit
nothing (in the normal mode it confirms nothing then: see the partition test). In the unsafe mode its own replica
applies each publish at once, so every publish through it is confirmed all the same. Whether a later kill loses
those messages is for the chaos checker to show; this test only shows the confirm does not wait for a majority.
"""

from __future__ import annotations

from pathlib import Path

from tests.cluster.cluster_proc import ClusterProcs, api_queue, channel, wait_until
from tests.cluster.test_cluster_processes import (
    QUORUM,
    Publisher,
    _wait_queue_everywhere,
)


def test_confirms_leave_without_a_majority_in_the_unsafe_mode(tmp_path: Path) -> None:
    procs = ClusterProcs(tmp_path, extra={"RAFTMQ_TEST_UNSAFE_CONFIRM_BEFORE_COMMIT": "true"})
    try:
        procs.start_all()
        n1 = procs.nodes[0]
        assert b"TEST-ONLY UNSAFE MODE test_unsafe_confirm_before_commit" in n1.log_text()
        queue = "q-unsafe"
        with channel(n1.port) as ch:
            ch.queue_declare(queue, durable=True, arguments=QUORUM)
        _wait_queue_everywhere(procs, queue)
        assert sorted(api_queue(n1.port, queue)["members"]) == ["n1", "n2", "n3"]
        procs.kill("n2")
        procs.kill("n3")
        wait_until(lambda: api_queue(n1.port, queue)["leader"] in (None, "n1"), 30, "n1 alone")
        commit_before = api_queue(n1.port, queue)["raft"]["commit"]
        publisher = Publisher(n1.port, queue, 10)
        publisher.run()
        assert publisher.confirmed == list(range(10))
        assert api_queue(n1.port, queue)["raft"]["commit"] == commit_before  # confirmed, yet nothing committed
    except BaseException:
        print(procs.logs())
        raise
    finally:
        procs.stop_all()
