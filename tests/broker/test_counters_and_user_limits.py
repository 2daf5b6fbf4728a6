"""The broker's monotonic counters (routed, unroutable dropped/returned, confirmed: node/broker/state.py) and its
user-limit checks (node/broker/user_limits.py), driven with node.amqp events, no processes."""

from __future__ import annotations

from node.amqp import methods as m
from node.broker import user_limits
from tests.broker.harness import connected, new_broker


def _counts(broker: object) -> tuple[int, int, int, int]:
    return (broker.messages_routed, broker.messages_unroutable_dropped,  # type: ignore[attr-defined]
            broker.messages_unroutable_returned, broker.messages_confirmed)  # type: ignore[attr-defined]


def test_counters_count_routed_unroutable_and_confirmed_and_ignore_firehose_copies() -> None:
    broker = new_broker()
    client = connected(broker)
    client.open()
    client.declare("q")
    client.call(m.ConfirmSelect())
    client.declare("traced")
    client.bind("traced", "amq.rabbitmq.trace", "#")
    broker.set_tracing("/", True, "n1")  # Firehose on: every publish is copied to the "traced" queue, uncounted
    client.publish("", "q")
    client.publish("", "nowhere")
    client.publish("", "nowhere", mandatory=True)
    assert _counts(broker) == (1, 1, 1, 3)
    client.close_channel()
    client.open(2)
    client.publish("", "q", channel=2)
    assert _counts(broker) == (2, 1, 1, 3)  # (no confirms on the new channel; nothing went down with the old one)


def test_user_limits_count_the_users_connections_and_channels() -> None:
    broker = new_broker()
    broker.add_user("u", "pw")
    broker.set_user_limits("u", user_limits.validate({"max-connections": 1, "max-channels": 2}))
    assert broker.user_limit_reached("u", user_limits.MAX_CONNECTIONS) is None
    client = connected(broker, user="u")
    assert broker.user_limit_reached("u", user_limits.MAX_CONNECTIONS) == 1
    assert broker.user_limit_reached("guest", user_limits.MAX_CONNECTIONS) is None
    client.open(1)
    assert broker.user_limit_reached("u", user_limits.MAX_CHANNELS) is None
    assert broker.user_limit_reached("u", user_limits.MAX_CHANNELS, own=1) == 2  # one the broker has not seen
    client.open(2)
    assert broker.user_limit_reached("u", user_limits.MAX_CHANNELS) == 2
    broker.set_user_limits("u", {"max-channels": -1})  # negative: no limit
    assert broker.user_limit_reached("u", user_limits.MAX_CHANNELS) is None
    assert broker.users.limits == {"u": {"max-channels": -1}}
    records = [r for p in broker.take_effects() if hasattr(p, "records") for r in p.records]
    assert records[-1].limits == {"max-channels": -1}  # stored with the user record
