"""SetArgs through the broker's single-node path (`delivery.apply_queue`), the way policies apply it."""

from __future__ import annotations

from cluster.queue import QueueArgs, SetArgs
from node.amqp import methods as m
from node.broker import delivery, publish
from tests.broker.harness import connected


def test_single_node_set_args_dead_letters_heads_over_the_new_limit() -> None:
    c = connected()
    c.call(m.ExchangeDeclare(exchange="dlx", type="fanout"))
    c.declare("dead")
    c.bind("dead", "dlx")
    c.declare("work", arguments={"x-dead-letter-exchange": "dlx"})
    for index in range(3):
        c.publish("", "work", f"m{index}".encode())
    vhost = c.broker.vhosts["/"]
    work = vhost.queues["work"]
    delivery.apply_queue(c.broker, work, SetArgs(QueueArgs(max_length=1, dead_letter_exchange="dlx")))
    publish.run_dead_letters(c.broker)
    assert work.machine.ready_count == 1
    assert work.machine.args.max_length == 1
    assert vhost.queues["dead"].machine.ready_count == 2
    got = c.call(m.BasicGet(queue="dead", no_ack=True))
    [ok] = [e for e in got if isinstance(e.method, m.BasicGetOk)]
    assert ok.body == b"m0"
    assert ok.properties.headers["x-death"][0]["reason"] == "maxlen"
