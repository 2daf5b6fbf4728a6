"""Cluster mode: a definition change answers ok only after the metadata group committed it (docs/cluster.md,
"Definitions from clients"); refused or not committed in time, the client's channel is closed with an error.

- Pure: the channel error for each kind of failure (`refusal_reply`, `not_committed_text`) and the records that
  take the broker back to the committed metadata after a failed Persist (`uncommitted_creations`).
- Real processes, three nodes: n2 and n3 killed, a durable queue.declare on n1 gets no declare-ok but a 541
  channel error once `definition_timeout_ms` ran out (5 s here, 30 s by default; the time is printed, not
  asserted), and n1 does not keep the queue; a management change (PUT of a vhost) made meanwhile is answered 503. After n2 and n3 return, the same declare is answered and every node knows the queue.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
import requests

from cluster.metadata import model as md
from node.broker import records as br
from node.runtime.cluster.definition_replies import (
    INTERNAL_ERROR,
    NOT_FOUND,
    PRECONDITION_FAILED,
    not_committed_text,
    refusal_reply,
    uncommitted_creations,
)
from tests.cluster.cluster_proc import (
    ClusterProcs,
    channel,
    management_up,
    queue_known,
    supervised,
    wait_until,
)

QUEUE = "q-definition-reply"
DEFINITION_TIMEOUT_S = 5.0  # the nodes' definition_timeout_ms (30 s by default), shorter to keep the test short


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClusterProcs]:
    extra = {"RAFTMQ_DEFINITION_TIMEOUT_MS": str(int(DEFINITION_TIMEOUT_S * 1000))}
    with supervised(ClusterProcs(tmp_path, extra=extra)) as procs:
        yield procs.start_all()


def test_failures_map_to_channel_errors() -> None:
    declare = md.DeclareQueue(md.QueueRecord("/", "q", leader="n1", members=("n1",)))
    assert refusal_reply(declare, "queue 'q' in vhost / exists with a different definition")[0] == PRECONDITION_FAILED
    code, text = refusal_reply(declare, "no vhost v")
    assert (code, text) == (NOT_FOUND, "NOT_FOUND - no vhost v")
    assert refusal_reply(declare, "something else")[0] == INTERNAL_ERROR
    assert not_committed_text(declare, 30.0).startswith("INTERNAL_ERROR - DeclareQueue not committed")


def test_uncommitted_creations_are_undone_and_committed_ones_kept() -> None:
    kept_queue = md.QueueRecord("/", "kept", leader="n1", members=("n1",))
    state = md.MetadataState(queues={("/", "kept"): kept_queue})
    records = [
        br.ExchangeRecord("/", "x", "direct"),
        br.QueueRecord("/", "lost"),
        br.QueueRecord("/", "kept"),
        br.BindingRecord("/", "x", "queue", "lost", "k"),
        br.QueueRecord("/", "gone", deleted=True),  # a failed deletion is not undone here
    ]
    undo = uncommitted_creations(records, state)
    assert undo == [
        br.BindingRecord("/", "x", "queue", "lost", "k", deleted=True),
        br.ExchangeRecord("/", "x", "direct", deleted=True),
        br.QueueRecord("/", "lost", deleted=True),
    ]


def _declare(port: int) -> tuple[pika.exceptions.ChannelClosedByBroker | None, float]:
    """Durable queue.declare on a fresh connection: (the channel error or None when declare-ok came, seconds)."""
    started = time.monotonic()
    try:
        with channel(port) as ch:
            ch.queue_declare(QUEUE, durable=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        return exc, time.monotonic() - started
    return None, time.monotonic() - started


@pytest.mark.timeout(300)
def test_declare_without_a_metadata_majority_fails_and_works_once_it_is_back(cluster: ClusterProcs,
                                                                            tmp_path: Path) -> None:
    n1 = cluster.node("n1")
    wait_until(lambda: management_up(n1.port), 30, "n1's management API to listen")  # it starts after AMQP
    cluster.kill("n2")
    cluster.kill("n3")
    vhost_put: list[int] = []  # a management change meanwhile: answered 503, not 2xx
    putter = threading.Thread(target=lambda: vhost_put.append(requests.put(
        f"http://127.0.0.1:{n1.port + 10_000}/api/vhosts/v-no-majority", auth=("guest", "guest"),
        timeout=DEFINITION_TIMEOUT_S + 30).status_code))
    putter.start()
    error, elapsed_s = _declare(n1.port)
    putter.join()
    assert vhost_put == [503], vhost_put
    print(f"declare without majority: channel error after {elapsed_s:.1f} s (limit {DEFINITION_TIMEOUT_S} s)")
    assert error is not None, "declare-ok although the metadata group could not commit the queue"
    assert error.reply_code == INTERNAL_ERROR, error
    assert not queue_known(n1.port, QUEUE)  # the node did not keep a queue the cluster never recorded
    cluster.restart("n2")
    cluster.restart("n3")
    result: list[pika.exceptions.ChannelClosedByBroker | None] = []

    def declared() -> bool:
        error, _ = _declare(n1.port)
        result.append(error)
        return error is None

    wait_until(declared, 3 * DEFINITION_TIMEOUT_S, "the declare to succeed with the majority back", poll_s=1.0)
    for node in ("n2", "n3"):
        wait_until(lambda node=node: queue_known(cluster.node(node).port, QUEUE), 30, f"{node} to know the queue")
