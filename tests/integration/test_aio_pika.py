"""aio-pika (asyncio, on aiormq) against the broker. Each test runs its own asyncio loop (pytest runs trio)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
import aio_pika.exceptions
import aiormq.exceptions
import pamqp.commands
import pytest

from tests.integration.conftest import Target

TIMEOUT_S = 15.0


def run(target: Target, scenario: Callable[[aio_pika.abc.AbstractRobustConnection], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        connection = await aio_pika.connect_robust(target.url(), timeout=TIMEOUT_S)
        async with connection:
            return await asyncio.wait_for(scenario(connection), TIMEOUT_S)

    return asyncio.run(main())


def test_publish_confirm_and_consume_iterator(amqp_target: Target, uid: str) -> None:
    async def scenario(connection: Any) -> list[bytes]:
        channel = await connection.channel()  # publisher confirms on by default
        exchange = await channel.declare_exchange(f"aio-x-{uid}", aio_pika.ExchangeType.TOPIC, auto_delete=True)
        queue = await channel.declare_queue(exclusive=True)
        await queue.bind(exchange, "orders.*")
        for i in range(20):
            confirmation = await exchange.publish(aio_pika.Message(f"m{i}".encode()), routing_key="orders.new")
            assert isinstance(confirmation, pamqp.commands.Basic.Ack)
        await exchange.publish(aio_pika.Message(b"skip"), routing_key="other")
        got = []
        async with queue.iterator() as messages:
            async for message in messages:
                async with message.process():
                    got.append(message.body)
                if len(got) == 20:
                    break
        return got

    assert run(amqp_target, scenario) == [f"m{i}".encode() for i in range(20)]


def test_nack_requeue_redelivers(amqp_target: Target) -> None:
    async def scenario(connection: Any) -> tuple[bool, bool, bytes]:
        channel = await connection.channel()
        queue = await channel.declare_queue(exclusive=True)
        await channel.default_exchange.publish(aio_pika.Message(b"again"), routing_key=queue.name)
        first = await queue.get(timeout=5)
        await first.nack(requeue=True)
        second = await queue.get(timeout=5)
        await second.ack()
        return first.redelivered, second.redelivered, second.body

    assert run(amqp_target, scenario) == (False, True, b"again")


def test_qos_limits_unacked_deliveries(amqp_target: Target) -> None:
    async def scenario(connection: Any) -> int:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=2)
        queue = await channel.declare_queue(exclusive=True)
        for i in range(6):
            await channel.default_exchange.publish(aio_pika.Message(str(i).encode()), routing_key=queue.name)
        received: list[Any] = []
        await queue.consume(received.append)
        for _ in range(50):
            if len(received) >= 2:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        return len(received)

    assert run(amqp_target, scenario) == 2


def test_transaction_commit_and_rollback(amqp_target: Target) -> None:
    async def scenario(connection: Any) -> list[bytes]:
        channel = await connection.channel(publisher_confirms=False)
        queue = await channel.declare_queue(exclusive=True)
        tx = channel.transaction()
        await tx.select()
        await channel.default_exchange.publish(aio_pika.Message(b"rolled-back"), routing_key=queue.name)
        await tx.rollback()
        await channel.default_exchange.publish(aio_pika.Message(b"committed"), routing_key=queue.name)
        await tx.commit()
        bodies = []
        while (message := await queue.get(fail=False, no_ack=True)) is not None:
            bodies.append(message.body)
        return bodies

    assert run(amqp_target, scenario) == [b"committed"]


def test_dead_letter_on_reject(amqp_target: Target, uid: str) -> None:
    async def scenario(connection: Any) -> tuple[bytes, str]:
        channel = await connection.channel()
        dlx = await channel.declare_exchange(f"aio-dlx-{uid}", aio_pika.ExchangeType.FANOUT, auto_delete=True)
        dead = await channel.declare_queue(exclusive=True)
        await dead.bind(dlx)
        work = await channel.declare_queue(exclusive=True, arguments={"x-dead-letter-exchange": dlx.name})
        await channel.default_exchange.publish(aio_pika.Message(b"poison"), routing_key=work.name)
        message = await work.get(timeout=5)
        await message.reject(requeue=False)
        for _ in range(100):
            got = await dead.get(fail=False)
            if got is not None:
                await got.ack()
                return got.body, got.headers["x-death"][0]["reason"]
            await asyncio.sleep(0.05)
        raise AssertionError("nothing dead-lettered")

    assert run(amqp_target, scenario) == (b"poison", "rejected")


def test_missing_queue_raises_channel_not_found(amqp_target: Target, uid: str) -> None:
    async def scenario(connection: Any) -> None:
        channel = await connection.channel()
        await channel.declare_queue(f"aio-missing-{uid}", passive=True)

    with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
        run(amqp_target, scenario)


def test_mandatory_unroutable_raises_delivery_error(amqp_target: Target, uid: str) -> None:
    async def scenario(connection: Any) -> None:
        channel = await connection.channel(on_return_raises=True)
        exchange = await channel.declare_exchange(f"aio-x-{uid}", aio_pika.ExchangeType.DIRECT, auto_delete=True)
        queue = await channel.declare_queue(exclusive=True)
        await queue.bind(exchange, "known")  # keeps the auto-delete exchange alive
        await exchange.publish(aio_pika.Message(b"lost"), routing_key="nowhere", mandatory=True)

    with pytest.raises(aio_pika.exceptions.DeliveryError):
        run(amqp_target, scenario)


def test_rpc_over_direct_reply_to(amqp_target: Target) -> None:
    async def scenario(connection: Any) -> bytes:
        channel = await connection.channel()
        requests = await channel.declare_queue(exclusive=True)

        async def serve(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            async with message.process():
                await channel.default_exchange.publish(
                    aio_pika.Message(message.body.upper(), correlation_id=message.correlation_id),
                    routing_key=message.reply_to,
                )

        await requests.consume(serve)
        reply_queue = await channel.get_queue("amq.rabbitmq.reply-to", ensure=False)
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        async def on_reply(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            if not future.done():
                future.set_result(message.body)

        await reply_queue.consume(on_reply, no_ack=True)
        await channel.default_exchange.publish(
            aio_pika.Message(b"ping", reply_to="amq.rabbitmq.reply-to", correlation_id="1"),
            routing_key=requests.name,
        )
        return await future

    assert run(amqp_target, scenario) == b"PING"


def test_robust_connection_recovers_after_node_restart(own_node: Target) -> None:
    """aio-pika's robust connection reconnects to the restarted node and finds the durable queue and message."""
    assert own_node.node is not None
    node = own_node.node

    async def main() -> list[bytes]:
        connection = await aio_pika.connect_robust(own_node.url(), timeout=TIMEOUT_S, reconnect_interval=0.2)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("aio-robust", durable=True)
            await channel.default_exchange.publish(
                aio_pika.Message(b"before", delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=queue.name)
            await asyncio.to_thread(node.restart)
            got = []
            for _ in range(200):
                try:
                    message = await queue.get(fail=False, no_ack=True)
                except (aio_pika.exceptions.AMQPError, ConnectionError, RuntimeError):
                    message = None
                if message is not None:
                    got.append(message.body)
                    break
                await asyncio.sleep(0.1)
            return got

    assert asyncio.run(asyncio.wait_for(main(), 60)) == [b"before"]
