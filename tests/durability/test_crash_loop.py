"""Crash loop on a real single node: SIGKILL at random moments during confirmed publish + acked consume.

One `raftmq node` process (chaos.nemesis.LocalCluster), a durable queue, persistent messages, four confirmed
publishers (chaos/workload.py; sequence numbers in the payload ids) and one consumer that acks in batches and
proves each ack durable (tests/durability/harness.py). A seeded RNG picks, for every round, how many more confirms
to wait for and a short extra pause, then the node is killed with SIGKILL and restarted at once. After the last
restart publishing stops, the consumer drains the queue, and the history is checked: every confirmed message was
delivered, no durably acked message came back, every redelivery is flagged, every delivered message was finally
acked, first deliveries keep each publisher's order.

The safe-mode variant runs the node with `test_drop_unsynced_on_kill` (each start cuts the log back to what the
last fsync covered, as a power loss would) and a slow fsync, so kills land between writes and their fsync.

Environment: RAFTMQ_DURABILITY_KILLS (default 15; the safe-mode variant does 2/3 of it),
RAFTMQ_DURABILITY_SEED (an int, or "random"; default fixed). The seed is printed (pytest -s, or in the failure).
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from pathlib import Path

from chaos.history import split
from chaos.nemesis import LocalCluster
from chaos.workload import Publisher, Recorder, WorkloadConfig
from tests.durability.harness import (
    AckLog,
    DurabilityResult,
    DurableAckConsumer,
    check_durability,
    wait_drained,
)

DEFAULT_SEED = 20261122
QUEUE = "durability-crash-loop"
PUBLISHERS = 4
ACK_BATCH_MAX = 20


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def kills_wanted(default: int = 15) -> int:
    return max(1, int(os.environ.get("RAFTMQ_DURABILITY_KILLS", default)))


def seed_wanted() -> int:
    raw = os.environ.get("RAFTMQ_DURABILITY_SEED", str(DEFAULT_SEED))
    return random.SystemRandom().randrange(2**31) if raw == "random" else int(raw)


def confirmed_count(recorder: Recorder) -> int:
    return recorder.confirmed_count


def wait_confirms(recorder: Recorder, target: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while confirmed_count(recorder) < target:
        assert time.monotonic() < deadline, f"no progress: {confirmed_count(recorder)} of {target} confirms"
        time.sleep(0.002)


def crash_loop(tmp_path: Path, kills: int, seed: int, extra_args: tuple[str, ...]) -> DurabilityResult:
    """Run the workload, kill -9 and restart the node `kills` times, drain, and check the history."""
    rng = random.Random(seed)
    cluster = LocalCluster.spawn(tmp_path / "cluster", 1, free_port() - 1, extra_args)
    config = WorkloadConfig(urls=(cluster.url("rmq1"),), queues=(QUEUE,), publishers=PUBLISHERS,
                            messages_per_publisher=10**9, durable=True, persistent=True, prefetch=50,
                            run_id=f"s{seed}")
    recorder, acks = Recorder(), AckLog()
    publish_stop = threading.Event()
    publishers = [Publisher(i, config, recorder, publish_stop) for i in range(PUBLISHERS)]
    consumer = DurableAckConsumer(config, QUEUE, recorder, acks, batch_max=ACK_BATCH_MAX)
    try:
        consumer.start()
        for publisher in publishers:
            publisher.start()
        for round_number in range(kills):
            wait_confirms(recorder, confirmed_count(recorder) + rng.randint(10, 120))
            time.sleep(rng.uniform(0.0, 0.05))
            recorder.fault("kill", "rmq1", f"round {round_number}")
            cluster.kill("rmq1")
            time.sleep(rng.uniform(0.0, 0.1))
            cluster.restart("rmq1")
            recorder.fault("restart", "rmq1")
        wait_confirms(recorder, confirmed_count(recorder) + 50)
        publish_stop.set()
        for publisher in publishers:
            publisher.join(30)
        assert not any(p.is_alive() for p in publishers), "publishers did not stop"
        assert wait_drained(consumer, cluster.url("rmq1"), config, QUEUE), "the queue did not drain"
    finally:
        publish_stop.set()
        consumer.stop()
        cluster.stop_all()
    assert not recorder.overflowed and not acks.overflowed
    publishes, deliveries, _ = split(recorder.records())
    return check_durability(publishes, deliveries, acks.batches())


def assert_durable(result: DurabilityResult, kills: int, seed: int) -> None:
    context = f"seed={seed} kills={kills}: {result.summary()}"
    print(context)
    checker = result.checker
    assert checker.lost == (), context
    assert checker.unexpected == (), context
    assert checker.order_violations == (), context
    assert result.acked_came_back == (), context
    assert result.unflagged_redeliveries == (), context
    assert result.never_settled == (), context
    assert len(result.ack_in_doubt) <= kills * ACK_BATCH_MAX, context
    assert checker.confirmed >= kills * 10, context


def test_kill_9_loop_keeps_every_confirmed_message(tmp_path: Path) -> None:
    kills, seed = kills_wanted(), seed_wanted()
    print(f"crash loop: seed={seed} kills={kills}")
    result = crash_loop(tmp_path, kills, seed, ())
    assert_durable(result, kills, seed)
    assert result.redeliveries > 0, "no kill ever found a message on disk: the test did not exercise recovery"


def test_kill_9_loop_with_unsynced_writes_dropped(tmp_path: Path) -> None:
    kills, seed = max(1, kills_wanted() * 2 // 3), seed_wanted() + 1
    print(f"crash loop (drop unsynced): seed={seed} kills={kills}")
    extra = ("--test-drop-unsynced-on-kill", "true", "--test-fsync-delay-ms", "5")
    result = crash_loop(tmp_path, kills, seed, extra)
    assert_durable(result, kills, seed)
