"""ShovelManager: the shovels of one node — which ones it runs, their tasks, their status (trio).

How it works: every `POLL_S` (and at once after `poke()`) the manager reads the stored definitions through
`definitions()` (vhost, name) -> JSON text (single node: the broker's parameters; cluster: the metadata's) and
`owner(vhost, name)` -> the node that should run it (single node: always this one; cluster: a deterministic
lease-based choice, cluster/link/ownership.py and docs/shovel.md). It starts a `ShovelRunner` task for each definition it
owns and does not run yet, cancels the task of one it no longer owns (moved, or deleted) or whose JSON changed
(restarted with the new definition), and keeps a finished one (delete-after reached) as `terminated` until its
definition is gone. A runner that fails unexpectedly is logged, shown `terminated` with the error and started
again after its reconnect delay (RabbitMQ leaves such a shovel terminated: rabbitmq-shovel#60). When a shovel with
an exchange source is deleted here, its durable source queue is deleted too (best effort). Every start and stop
of a copy is logged (`shovel copy started|stopped {json}`), and a runner asks `owner` again before each batch it
carries out (a node paused past its lease stops before acting).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import trio

from cluster.link.client import LinkClosed, open_link, wall_ms
from cluster.link.uri import AmqpUri
from cluster.shovel.link import TERMINATED
from cluster.shovel.params import ShovelDefinition, ShovelParamError, parse_definition
from cluster.shovel.runner import ShovelRunner, exchange_source_queue
from node.amqp import methods as m

log = logging.getLogger("raftmq.shovel")
POLL_S = 0.5
Key = tuple[str, str]


@dataclass
class _Entry:
    value: str
    definition: ShovelDefinition
    runner: ShovelRunner
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)


class ShovelManager:
    def __init__(self, node_name: str, definitions: Callable[[], dict[Key, str]],
                 owner: Callable[[str, str], str | None] | None = None, local: AmqpUri | None = None,
                 delete_definition: Callable[[str, str], Awaitable[None]] | None = None,
                 shovel_type: str = "dynamic") -> None:
        self.node_name = node_name
        self.shovel_type = shovel_type  # "dynamic", or "static" (the config file's, cluster/shovel/static.py)
        self.definitions = definitions
        self.owner = owner or (lambda vhost, name: node_name)
        self.local = local
        self.delete_definition = delete_definition
        self._entries: dict[Key, _Entry] = {}
        self._live: set[Key] = set()  # shovels with a task here, until it has finished (connections closed)
        self._invalid: dict[Key, str] = {}
        self._nursery: trio.Nursery | None = None
        self._wake = trio.Event()

    # ------------------------------------------------------------ API
    def poke(self) -> None:
        """Definitions changed: reconcile now instead of at the next poll."""
        self._wake.set()

    def running_here(self, vhost: str, name: str) -> bool:
        """Whether a copy of the shovel still exists on this node (running, or stopping: its task not finished)."""
        return (vhost, name) in self._live

    def restart(self, vhost: str, name: str) -> bool:
        """Restart a shovel running here (False: it does not run on this node)."""
        entry = self._entries.pop((vhost, name), None)
        if entry is None:
            return False
        entry.scope.cancel()
        self.poke()
        return True

    def status(self) -> list[dict[str, Any]]:
        """One row per defined shovel: the full status of those running here, the owner of the others."""
        rows: list[dict[str, Any]] = []
        try:
            stored = self.definitions()
        except Exception:  # the metadata is not readable now: show what runs here
            stored = {key: e.value for key, e in self._entries.items()}
        for (vhost, name) in sorted(stored):
            entry = self._entries.get((vhost, name))
            if entry is not None:
                row = entry.runner.link.status()
                row["node"] = self.node_name
                row["last_changed"] = _iso(row.pop("last_changed_ms"))
            elif (vhost, name) in self._invalid:
                row = {"name": name, "vhost": vhost, "type": "dynamic", "state": TERMINATED, "node": self.node_name,
                       "termination_reason": self._invalid[(vhost, name)]}
            else:
                owner = self.owner(vhost, name)
                row = {"name": name, "vhost": vhost, "type": "dynamic", "node": owner,
                       "state": "starting" if owner == self.node_name else "running elsewhere"}
            row["type"] = self.shovel_type
            rows.append(row)
        return rows

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                try:
                    self._reconcile(nursery)
                except Exception:
                    log.exception("shovels: reconcile failed")
                with trio.move_on_after(POLL_S):
                    await self._wake.wait()
                self._wake = trio.Event()

    # ------------------------------------------------------------ internals
    def _reconcile(self, nursery: trio.Nursery) -> None:
        stored = self.definitions()
        mine = {key: value for key, value in stored.items() if self.owner(*key) == self.node_name}
        for key, entry in list(self._entries.items()):
            if mine.get(key) != entry.value:
                del self._entries[key]
                entry.scope.cancel()
                if key not in stored:
                    log.info("shovel %s/%s deleted", *key)
                    if entry.definition.src_exchange is not None:
                        nursery.start_soon(self._drop_source_queue, entry.definition)
                else:
                    log.info("shovel %s/%s stopped here (moved or changed)", *key)
        self._invalid = {k: v for k, v in self._invalid.items() if k in mine}
        for key, value in mine.items():
            if key in self._entries or key in self._invalid:
                continue
            try:
                definition = parse_definition(key[0], key[1], json.loads(value))
            except (ShovelParamError, ValueError) as exc:  # stored before a stricter validation: shown, not run
                self._invalid[key] = f"invalid definition: {exc}"
                continue
            entry = _Entry(value, definition, self._runner(definition))
            self._entries[key] = entry
            nursery.start_soon(self._run_one, key, entry)
            log.info("shovel %s/%s starting on %s", key[0], key[1], self.node_name)

    def _runner(self, definition: ShovelDefinition) -> ShovelRunner:
        key = (definition.vhost, definition.name)
        return ShovelRunner(definition, self.node_name, self.local, self._deleted_self,
                            may_run=lambda: self.owner(*key) == self.node_name)

    async def _run_one(self, key: Key, entry: _Entry) -> None:
        self._live.add(key)
        with entry.scope:
            _report_copy("started", key, self.node_name)
            try:
                while True:
                    try:
                        await entry.runner.run()
                        return  # terminated (delete-after): kept as such until its definition is gone
                    except Exception as exc:
                        log.exception("shovel %s/%s failed", *key)
                        entry.runner.link.stop(f"failed: {type(exc).__name__}: {exc}", wall_ms())
                    await trio.sleep(max(entry.definition.reconnect_delay_ms, 1000) / 1000)
                    entry.runner = self._runner(entry.definition)
            finally:
                current = self._entries.get(key)
                if current is None or current is entry:  # (not replaced by a newer task for the same key)
                    self._live.discard(key)
                _report_copy("stopped", key, self.node_name)  # (its connections are closed by now)

    async def _deleted_self(self, definition: ShovelDefinition) -> None:
        log.info("shovel %s/%s completed (src-delete-after); deleting its definition", definition.vhost,
                 definition.name)
        if self.delete_definition is not None:
            try:
                await self.delete_definition(definition.vhost, definition.name)
            except Exception:
                log.exception("shovel %s/%s: deleting the completed definition failed", definition.vhost,
                              definition.name)

    async def _drop_source_queue(self, definition: ShovelDefinition) -> None:
        uri = definition.src_uri(0)
        if uri.local and self.local is not None:
            uri = replace(self.local, vhost=uri.vhost)
        try:
            with trio.move_on_after(30):
                async with open_link(uri, f"Shovel {definition.name} cleanup") as link:
                    ch = await link.channel()
                    await link.call(ch, m.QueueDelete(queue=exchange_source_queue(definition)), m.QueueDeleteOk)
        except (OSError, LinkClosed, trio.TooSlowError) as exc:
            log.warning("shovel %s/%s: its source queue was not deleted: %s", definition.vhost, definition.name, exc)


COPY_REPORT = "shovel copy "


def _report_copy(what: str, key: Key, node: str) -> None:
    """One log line when a copy of a shovel starts or stops on this node (after its connections closed), read by
    the chaos scenarios' check that no two copies ever run at once (chaos/shovel.py)."""
    log.info("%s%s %s", COPY_REPORT, what, json.dumps({"vhost": key[0], "name": key[1], "node": node,
                                                      "at_ms": wall_ms()}))


def _iso(ms: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
