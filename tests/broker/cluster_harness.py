"""A pure multi-replica harness for the broker's replicated mode: brokers a, b, c and one in-memory log per queue.

`Cluster.feed(node, effects)` plays the runtime: every `ProposeQueue` becomes an `Envelope` (with the proposal id the
broker numbered), encoded with the broker's `envelope_codec`, and is appended to its queue's log, unless the proposal is held (`hold=True`:
kept in `held` for `release()` or `abandon()`); every `Persist` is mirrored into the other live brokers'
`apply_records` and reported `on_persisted`; what is left (sends, closes) is returned and kept in `outbox`.
`commit()` reads each log's new entries with a broker's `envelope_codec` and applies them, in order, to every
live broker until nothing new was proposed. A queue's
leader is the node that declared it unless `set_leader` says otherwise. `crash(node)` stops a node (its clients get
nothing more) and reports it down to the others; `restart(node)` brings it back with a new boot id, definitions
replayed and every queue restored from a live peer's snapshot. `pause(node)` / `resume(node)`: a node that lags
(serves its clients, applies nothing) and then catches up by installing a peer's snapshot.
"""

from __future__ import annotations

from typing import Any

from cluster.queue.envelope import Envelope
from node.amqp import events as ev
from node.broker.broker import Broker, BrokerConfig
from node.broker.effects import Effect, Persist, ProposeQueue
from node.broker.records import QueueRecord, Record
from tests.broker.harness import Client

NODES = ("a", "b", "c")
QueueKey = tuple[str, str]


class Cluster:
    def __init__(self, nodes: tuple[str, ...] = NODES, **config: Any) -> None:
        self.config = config
        self.boots: dict[str, int] = {}
        self.brokers: dict[str, Broker] = {}
        for node in nodes:
            self._start(node, 1)
        self.logs: dict[QueueKey, list[bytes]] = {}
        self.applied: dict[tuple[str, QueueKey], int] = {}
        self.leaders: dict[QueueKey, str] = {}
        self.records: list[Record] = []  # every definition committed, in order
        self.outbox: dict[str, list[Effect]] = {node: [] for node in nodes}
        self.down: set[str] = set()
        self.paused: set[str] = set()  # alive (clients served, proposals sent) but applying nothing
        self.hold = False
        self.held: list[tuple[str, QueueKey, bytes]] = []

    def _start(self, node: str, boot_id: int) -> Broker:
        self.boots[node] = boot_id
        broker = Broker(BrokerConfig(node_name=node, boot_id=boot_id, replicated=True, **self.config))
        self.brokers[node] = broker
        return broker

    # --- the runtime's part -------------------------------------------------------------------------------

    def feed(self, node: str, effects: list[Effect]) -> list[Effect]:
        rest = self._route(node, effects)
        self.outbox[node].extend(rest)
        return rest

    def _route(self, node: str, effects: list[Effect]) -> list[Effect]:
        """The effects left for the clients (those `on_persisted` released included, where the Persist was)."""
        rest: list[Effect] = []
        for effect in effects:
            if isinstance(effect, ProposeQueue):
                self._propose(node, effect)
            elif isinstance(effect, Persist):
                rest.extend(self._persisted(node, effect))
            else:
                rest.append(effect)
        return rest

    def _propose(self, node: str, effect: ProposeQueue) -> None:
        key = (effect.vhost, effect.queue)
        envelope = Envelope(0, node, effect.proposal_id, effect.command)
        data = self.brokers[node].envelope_codec.encode(envelope)
        if self.hold:
            self.held.append((node, key, data))
        else:
            self.logs.setdefault(key, []).append(data)

    def _persisted(self, node: str, effect: Persist) -> list[Effect]:
        self.records.extend(effect.records)
        for record in effect.records:
            if isinstance(record, QueueRecord) and not record.deleted:
                key = (record.vhost, record.name)
                self.logs.setdefault(key, [])
                for other in self.brokers:
                    self.applied.setdefault((other, key), len(self.logs[key]))
                if key not in self.leaders:
                    self.set_leader(key, node)
        for other, broker in self.brokers.items():
            if other != node and other not in self.down:
                self.feed(other, broker.apply_records(list(effect.records)))
        return self._route(node, self.brokers[node].on_persisted(effect.token))

    def set_leader(self, key: QueueKey, node: str, alone: bool = False) -> None:
        """`alone`: `node` is told it is the group's only voter too (a classic queue's node)."""
        previous = self.leaders.get(key)
        self.leaders[key] = node
        for other, broker in self.brokers.items():
            if other in self.down:
                continue
            if other == previous and other != node:
                self.feed(other, broker.set_queue_leader(key[0], key[1], False))
            if other == node:
                self.feed(other, broker.set_queue_leader(key[0], key[1], True, alone))

    def commit(self, rounds_max: int = 50) -> None:
        """Apply every log's new entries to every live broker, repeating while the effects propose more."""
        for _ in range(rounds_max):
            progressed = False
            for key in list(self.logs):
                for node, broker in self.brokers.items():
                    if node in self.down or node in self.paused:
                        continue
                    log = self.logs[key]
                    start = self.applied.get((node, key), 0)
                    for index in range(start, len(log)):
                        self.applied[(node, key)] = index + 1
                        read = broker.envelope_codec.read_batch((log[index],), 0)
                        self.feed(node, broker.apply_committed(key[0], key[1], read.envelopes))
                        progressed = True
            if not progressed:
                return
        raise AssertionError("the cluster kept proposing")

    def release(self) -> None:
        """Append the held proposals to their logs (as if they had been delayed)."""
        held, self.held = self.held, []
        for _node, key, data in held:
            self.logs.setdefault(key, []).append(data)

    def duplicate_last(self, key: QueueKey) -> None:
        """Commit the last entry of a log a second time (a retried proposal)."""
        self.logs[key].append(self.logs[key][-1])

    def abandon(self) -> None:
        """The runtime gives up on every held proposal."""
        held, self.held = self.held, []
        for node, key, data in held:
            broker = self.brokers[node]
            self.feed(node, broker.proposal_abandoned(key[0], key[1], broker.envelope_codec.decode(data)))

    def tick(self, node: str, now_ms: int) -> list[Effect]:
        return self.feed(node, self.brokers[node].tick(now_ms))

    # --- failures -----------------------------------------------------------------------------------------

    def crash(self, node: str) -> None:
        self.down.add(node)
        for other, broker in self.brokers.items():
            if other not in self.down:
                self.feed(other, broker.node_down(node))

    def restart(self, node: str, from_snapshots: bool = True) -> Broker:
        """A new life of `node`: definitions replayed, each queue restored from a live peer (or replayed)."""
        broker = self._start(node, self.boots[node] + 1)
        self.down.discard(node)
        self.outbox[node] = []
        self.feed(node, broker.apply_records(list(self.records)))
        peer = next(n for n in self.brokers if n not in self.down and n != node)
        for key in self.logs:
            if key[1] not in broker.vhosts[key[0]].queues:
                continue
            if from_snapshots:
                data = self.brokers[peer].queue_snapshot(*key)
                self.applied[(node, key)] = self.applied.get((peer, key), 0)
                self.feed(node, broker.queue_restore(key[0], key[1], data))
            else:
                self.applied[(node, key)] = 0
            if self.leaders.get(key) == node:
                self.feed(node, broker.set_queue_leader(key[0], key[1], True))
        return broker

    def pause(self, node: str) -> None:
        self.paused.add(node)

    def resume(self, node: str) -> None:
        """A lagging node catches up by installing a live peer's snapshot of every queue (Raft InstallSnapshot)."""
        self.paused.discard(node)
        peer = next(n for n in self.brokers if n not in self.down and n not in self.paused)
        broker = self.brokers[node]
        for key in self.logs:
            if key[1] in broker.vhosts[key[0]].queues:
                self.applied[(node, key)] = self.applied.get((peer, key), 0)
                self.feed(node, broker.queue_restore(key[0], key[1], self.brokers[peer].queue_snapshot(*key)))

    def snapshots(self, key: QueueKey) -> dict[str, bytes]:
        return {node: b.queue_snapshot(*key) for node, b in self.brokers.items()
                if node not in self.down and node not in self.paused}


class ClusterClient(Client):
    """harness.Client on one node of a Cluster: effects go through the cluster, client-facing ones come back."""

    def __init__(self, cluster: Cluster, node: str, conn_id: int = 1, **kw: Any) -> None:
        self.cluster = cluster
        self.node = node
        super().__init__(cluster.brokers[node], conn_id, **kw)

    def handle(self, event: Any) -> list[Effect]:
        return self.cluster.feed(self.node, self.broker.handle(self.conn_id, event, self.now_ms))

    def writable(self, writable: bool = True) -> list[Effect]:
        return self.cluster.feed(self.node, self.broker.set_writable(self.conn_id, writable))


def cluster_client(cluster: Cluster, node: str, conn_id: int = 1, **kw: Any) -> ClusterClient:
    client = ClusterClient(cluster, node, conn_id, **kw)
    client.handle(ev.ChannelOpened(1))
    return client


def take(cluster: Cluster, node: str) -> list[Effect]:
    """The client-facing effects `node` produced since the last take."""
    out, cluster.outbox[node] = cluster.outbox[node], []
    return out
