"""Which broker handler answers which AMQP channel method: the table `Broker` dispatches channel methods through.

Exchange, queue and binding methods go to `definitions`, basic.* consumption and acknowledgement to `delivery`,
confirm and tx to `publish`; channel.flow is answered here. Cluster mode overrides some entries with its own
(`replica.HANDLERS`, merged by `Broker._choose_backends`). A method with no entry closes the connection with 540.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from node.amqp import methods as m
from node.broker import definitions, delivery, publish
from node.broker.channel import ChannelState, ConnState
from node.broker.effects import Send
from node.broker.errors import AmqpError
from node.broker.state import BrokerState

Handler = Callable[[BrokerState, ConnState, ChannelState, Any], None]


def _send(broker: BrokerState, ch: ChannelState, method: Any) -> None:
    broker.out.append(Send(ch.conn_id, ch.number, method))


def _channel_flow(broker: BrokerState, conn: ConnState, ch: ChannelState, method: m.ChannelFlow) -> None:
    """RabbitMQ 3.x answers flow(active=true) and refuses to pause a channel: 540 closes the connection."""
    if not method.active:
        raise AmqpError(540, "active=false", connection=True)
    _send(broker, ch, m.ChannelFlowOk(active=True))


HANDLERS: dict[type, Handler] = {
    m.ChannelFlow: _channel_flow,
    m.ExchangeDeclare: definitions.exchange_declare,
    m.ExchangeDelete: definitions.exchange_delete,
    m.ExchangeBind: definitions.exchange_bind,
    m.ExchangeUnbind: definitions.exchange_unbind,
    m.QueueDeclare: definitions.queue_declare,
    m.QueueBind: definitions.queue_bind,
    m.QueueUnbind: definitions.queue_unbind,
    m.QueuePurge: definitions.queue_purge,
    m.QueueDelete: definitions.queue_delete,
    m.BasicQos: delivery.basic_qos,
    m.BasicConsume: delivery.basic_consume,
    m.BasicCancel: delivery.basic_cancel,
    m.BasicGet: delivery.basic_get,
    m.BasicAck: delivery.basic_ack,
    m.BasicNack: delivery.basic_nack,
    m.BasicReject: delivery.basic_reject,
    m.BasicRecover: delivery.basic_recover,
    m.BasicRecoverAsync: delivery.basic_recover,
    m.ConfirmSelect: publish.confirm_select,
    m.TxSelect: publish.tx_select,
    m.TxCommit: publish.tx_commit,
    m.TxRollback: publish.tx_rollback,
}
