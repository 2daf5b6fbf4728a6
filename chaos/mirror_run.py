"""Real-process mirrored-queue chaos runs: the seed's five scenarios on replica processes, files and sockets.

What it is for: `raftmq chaos run hw-truncation-loss [--truncation hw|leader-epoch] [--unsafe]` and the other
four scenarios of issue 17 (chaos/scenarios/*.toml with a `[mirror]` table) run on real replica processes
(cluster/mirror_queues/runtime/node.py, kill -9, restarts, files fsynced or left in the "page cache") with the
controller committing leader, epoch and ISR into a metadata state (cluster/metadata/mirror.py through
`model.apply`, as in tests/metadata/test_mirror_controller.py; the pysyncobj group adds replication of that
state, which tests/mirror/test_processes.py covers). The checker (chaos/mirror_check.py) names the confirmed
messages lost and the offsets below the HW where replicas differ.

How it works: this process hosts the controller and the client (a `MirrorClient`: publish a message, get its
confirm, nack or nothing, which is all a scenario needs from its workload, so an AMQP client through the broker can
take its place once the broker carries mirrored queues). Every replica-to-replica link goes through a
`LinkProxy` here, one per direction, so `isolate` can hold a link (connections closed, redials refused: what the
replica sends waits in its outbox or is dropped, as on a partition) while the controller's and the client's links
stay up: the crash between a request and its reply that the seed's scenarios need. The harness is also the
failure detector (every kill is reported to the controller at once); a replica's repeated hello (its LeaderAndIsr
still on the way) is the controller's to tell from a restart (the incarnation id in `Hello`).

Steps (`[[mirror.steps]]`): publish {messages, wait = true: one at a time until confirmed, nacked or `timeout_s`
(a `not-leader` nack, no leader, or no answer in RESEND_S is retried until then); false: sent to the leader
without waiting}; wait {seconds}; wait-caught-up (every live replica in the leader's ISR at its LEO); wait-live
{target} (its hello since its start reached the controller); wait-role {target, role} (it leads or follows the
committed epoch); wait-out-of-isr {target}; wait-leo {target, leo}; kill {target} (SIGKILL, then the verdict to
the controller); restart {target}; isolate {target}; heal {target, default every link}; transfer {target} (the
controller's leadership move). A step that cannot be carried out ends the steps and fails the run. Afterwards
every link is healed, every killed replica restarted and the run waits until every replica is in the leader's ISR
at its LEO and the HW is the LEO; then every replica's log is read from its files (plus, for `flush =
"unsynced"`, the unflushed tail the live process holds: its "page cache") and checked.
Settings: `[mirror] settings` (core `Settings` and the runtime's timer fields, every replica),
`[mirror.replica_settings.NAME]` (one replica's own), `[mirror.unsafe]` (the variant the scenario fails under,
applied with `unsafe`); the command line's `--truncation`/`--promote` override all of them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import trio

from chaos.mirror_check import MirrorCheck, check_mirror
from chaos.run import port_free
from cluster.metadata import model
from cluster.metadata.commands import DeclareQueue, PutVhost, QueueRecord
from cluster.metadata.mirror import DeclareMirror, MirrorRecord, TransferMirror
from cluster.metadata.model import Command, MetadataState, Outcome
from cluster.mirror_queues.core.types import Record, Settings
from cluster.mirror_queues.runtime.controller import MirrorController
from cluster.mirror_queues.runtime.node import NodeConfig
from cluster.mirror_queues.runtime.storage import ReplicaStore
from cluster.mirror_queues.runtime.transport import MirrorTransport
from cluster.mirror_queues.runtime.wire import Hello, Publish, PublishResult, Status, StatusReply, WireMessage
from deploy.portshard import owned

VHOST, QUEUE = "/", "mirror-chaos"
ACTIONS = ("publish", "wait", "wait-caught-up", "wait-live", "wait-role", "wait-out-of-isr", "wait-leo", "kill", "restart",
           "isolate", "heal", "transfer")
SETTINGS_FIELDS = {f.name for f in dataclasses.fields(Settings)}
NODE_FIELDS = {"tick_ms", "fetch_timeout_ms", "fetch_max_wait_ms", "writeback_interval_ms"}
WAIT_TIMEOUT_S = 60.0  # generous: on a loaded machine a replica process takes seconds to start
PUBLISH_TIMEOUT_S = 10.0
SETTLE_TIMEOUT_S = 60.0
PROBES = 3
RESEND_S = 2.0  # a publish unanswered this long is sent again (as a publisher retries; a copy may be appended)
PORT_LOW, PORT_HIGH = 20000, 32000  # below the ephemeral range: a restarted replica finds its port free again


class MirrorScenarioError(ValueError):
    pass


class StepFailed(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class MirrorStep:
    action: str
    target: str = ""
    messages: tuple[str, ...] = ()
    wait: bool = True
    timeout_s: float = 0.0  # 0: publish 10 s, a wait step WAIT_TIMEOUT_S
    seconds: float = 0.0
    role: str = ""
    leo: int = 0


@dataclass(frozen=True, slots=True)
class MirrorSpec:
    replicas: tuple[str, ...]
    steps: tuple[MirrorStep, ...]
    source: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    replica_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    unsafe: dict[str, Any] = field(default_factory=dict)

    def settings_for(self, replica: str, unsafe: bool, overrides: dict[str, Any]) -> dict[str, Any]:
        """Every setting of one replica: the scenario's, the replica's own, the unsafe variant, the overrides."""
        merged = {**self.settings, **self.replica_settings.get(replica, {})}
        if unsafe:
            merged.update(self.unsafe)
        merged.update(overrides)
        return merged


def _check_keys(where: str, values: dict[str, Any]) -> None:
    unknown = set(values) - SETTINGS_FIELDS - NODE_FIELDS
    if unknown:
        raise MirrorScenarioError(f"{where}: unknown settings {sorted(unknown)}")


def parse_mirror(raw: dict[str, Any]) -> MirrorSpec:
    replicas = tuple(str(r) for r in raw.get("replicas", ()))
    if len(replicas) < 2 or len(set(replicas)) != len(replicas):
        raise MirrorScenarioError("[mirror] replicas: two or more distinct names")
    steps = []
    for step in raw.get("steps", []):
        action = step.get("action")
        if action not in ACTIONS:
            raise MirrorScenarioError(f"unknown mirror action {action!r}: expected one of {ACTIONS}")
        unknown = set(step) - {f.name for f in dataclasses.fields(MirrorStep)}
        if unknown:
            raise MirrorScenarioError(f"mirror step {action}: unknown keys {sorted(unknown)}")
        target = str(step.get("target", ""))
        if target and target not in replicas:
            raise MirrorScenarioError(f"mirror step {action}: unknown replica {target!r}")
        steps.append(MirrorStep(action, target, tuple(str(m) for m in step.get("messages", ())),
                                bool(step.get("wait", True)), float(step.get("timeout_s", 0.0)),
                                float(step.get("seconds", 0.0)), str(step.get("role", "")), int(step.get("leo", 0))))
    settings = dict(raw.get("settings", {}))
    per_replica = {str(k): dict(v) for k, v in raw.get("replica_settings", {}).items()}
    unsafe = dict(raw.get("unsafe", {}))
    _check_keys("[mirror] settings", settings)
    _check_keys("[mirror.unsafe]", unsafe)
    for name, values in per_replica.items():
        if name not in replicas:
            raise MirrorScenarioError(f"[mirror.replica_settings.{name}]: not a replica")
        _check_keys(f"[mirror.replica_settings.{name}]", values)
    return MirrorSpec(replicas, tuple(steps), str(raw.get("source", "")), settings, per_replica, unsafe)


class MirrorClient(Protocol):
    """The scenario's workload: publish one message, learn its fate (None: no answer in time, outcome unknown)."""

    async def publish(self, msg: str, timeout_s: float) -> PublishResult | None: ...

    def publish_nowait(self, msg: str) -> None: ...


def _free_ports(count: int) -> list[int]:
    rng = random.Random()
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randrange(PORT_LOW, PORT_HIGH)
        if port not in ports and owned(port) and port_free(port):
            ports.append(port)
    return ports


class LinkProxy:
    """One direction of one replica-to-replica link (the dialer's side of MirrorTransport's one-way connections)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self.blocked = False
        self._scopes: set[trio.CancelScope] = set()

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, down: trio.SocketStream) -> None:
        async with down:
            if self.blocked:
                return
            try:
                up = await trio.open_tcp_stream(*self.target)
            except OSError:
                return
            async with up, trio.open_nursery() as nursery:
                self._scopes.add(nursery.cancel_scope)
                nursery.start_soon(_pipe, down, up, nursery.cancel_scope)
                nursery.start_soon(_pipe, up, down, nursery.cancel_scope)
            self._scopes.discard(nursery.cancel_scope)

    def block(self) -> None:
        self.blocked = True
        for scope in self._scopes:
            scope.cancel()

    def unblock(self) -> None:
        self.blocked = False


async def _pipe(src: trio.SocketStream, dst: trio.SocketStream, scope: trio.CancelScope) -> None:
    try:
        async for chunk in src:
            await dst.send_all(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    scope.cancel()


class MirrorCluster:
    """The replica processes, their link proxies, the controller and the client of one run."""

    def __init__(self, spec: MirrorSpec, settings: dict[str, dict[str, Any]], directory: Path) -> None:
        self.spec = spec
        self.settings = settings
        self.directory = directory
        self.secret = secrets.token_hex(16)
        ports = _free_ports(len(spec.replicas))
        self.addresses = {name: ("127.0.0.1", port) for name, port in zip(spec.replicas, ports, strict=True)}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.results: dict[str, PublishResult] = {}
        self.sent: list[str] = []
        self.statuses: dict[str, StatusReply] = {}
        self.events: list[str] = []
        self.greeted: set[str] = set()  # replicas whose hello since their last start reached the controller
        self.started = time.monotonic()
        first = settings[spec.replicas[0]]
        self.state = MetadataState()
        for command in (PutVhost(VHOST),
                        DeclareQueue(QueueRecord(VHOST, QUEUE, type="mirrored", leader=spec.replicas[0],
                                                 members=spec.replicas)),
                        DeclareMirror(VHOST, QUEUE, spec.replicas, int(first.get("min_insync", 1)),
                                      str(first.get("promote_on_failure", "when-synced")),
                                      bool(first.get("eligible_leader_replicas", True)))):
            self.state, outcome = model.apply(self.state, command)
            if outcome.refused:
                raise MirrorScenarioError(f"{type(command).__name__} refused: {outcome.refused}")
        self.proxies = {(a, b): LinkProxy(self.addresses[b]) for a in spec.replicas for b in spec.replicas if a != b}
        self.ctl_port = _free_ports(1)[0]
        self.transport = MirrorTransport("ctl", self.secret.encode(), dict(self.addresses), self._on_message)
        self.controller = MirrorController(VHOST, QUEUE, self.commit, self.record, self.transport.send)

    # --- controller and client ---------------------------------------------------------------------------------

    async def commit(self, command: Command) -> Outcome:
        self.state, outcome = model.apply(self.state, command)
        record = self.record()
        if record is not None:
            self.note(f"controller: {type(command).__name__} -> leader {record.leader or '-'} epoch {record.epoch} "
                      f"ISR {list(record.isr)} ELR {list(record.elr)}" + (f" ({outcome.refused})"
                                                                         if outcome.refused else ""))
        return outcome

    def record(self) -> MirrorRecord | None:
        return self.state.mirrors.get((VHOST, QUEUE))

    def note(self, text: str) -> None:
        self.events.append(f"{time.monotonic() - self.started:7.2f}s {text}")

    def _on_message(self, src: str, message: WireMessage) -> None:
        if isinstance(message, PublishResult):
            self.results[message.msg] = message
        elif isinstance(message, StatusReply):
            self.statuses[src] = message
        else:
            if isinstance(message, Hello):
                self.greeted.add(src)
            self.controller.on_message(src, message)

    async def publish(self, msg: str, timeout_s: float) -> PublishResult | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            record = self.record()
            if record is None or not record.leader or record.leader not in self.procs:
                await trio.sleep(0.05)
                continue
            self.results.pop(msg, None)
            self.sent.append(msg)
            self.transport.send(record.leader, Publish(msg))
            with trio.move_on_after(max(0.0, min(RESEND_S, deadline - time.monotonic()))):
                while msg not in self.results:
                    await trio.sleep(0.005)
            result = self.results.get(msg)
            if result is None:
                continue  # lost on the way (a link to a restarted process drops what it wrote first): again
            if not result.ok and result.reason == "not-leader":
                await trio.sleep(0.05)  # not appended: the leader has not taken over yet; try again
                continue
            return result
        return None

    def publish_nowait(self, msg: str) -> None:
        record = self.record()
        if record is None or not record.leader:
            raise StepFailed(f"publish {msg}: no leader")
        self.sent.append(msg)
        self.transport.send(record.leader, Publish(msg))

    async def status(self, name: str, with_log: bool = False) -> StatusReply:
        self.statuses.pop(name, None)
        with trio.fail_after(WAIT_TIMEOUT_S):
            while name not in self.statuses:
                self.transport.send(name, Status(with_log=with_log))
                with trio.move_on_after(0.5):
                    while name not in self.statuses:
                        await trio.sleep(0.01)
        return self.statuses[name]

    # --- processes and links -----------------------------------------------------------------------------------

    def start(self, name: str) -> None:
        values = self.settings[name]
        peers = {"ctl": ("127.0.0.1", self.ctl_port)}
        peers.update({other: ("127.0.0.1", self.proxies[(name, other)].port) for other in self.spec.replicas
                      if other != name})
        node = NodeConfig(name=name, directory=str(self.directory / name), host="127.0.0.1",
                          port=self.addresses[name][1], peers=peers, controller="ctl", secret=self.secret,
                          group=f"mirror/%2F/{QUEUE}",
                          settings={k: v for k, v in values.items() if k in SETTINGS_FIELDS},
                          **{k: v for k, v in values.items() if k in NODE_FIELDS})
        path = self.directory / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dataclasses.asdict(node)))
        self.greeted.discard(name)
        with (self.directory / f"{name}.log").open("ab") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "cluster.mirror_queues.runtime.node", str(path)], stdout=log, stderr=log,
                cwd=str(Path(__file__).resolve().parent.parent))
        self.note(f"started {name}")

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            raise StepFailed(f"kill {name}: not running")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # What the controller writes first into its connection to the dead process is lost, and only the next
        # write finds the connection reset: spend that on probes the replica ignores, not on a LeaderAndIsr.
        for _ in range(PROBES):
            self.transport.send(name, PublishResult("", False, reason="probe"))
        self.note(f"killed {name} (kill -9)")
        self.controller.replica_down(name)  # the failure detector's verdict

    def isolate(self, name: str) -> None:
        for (a, b), proxy in self.proxies.items():
            if name in (a, b):
                proxy.block()
        self.note(f"isolated {name} from the other replicas")

    def heal(self, name: str = "") -> None:
        for (a, b), proxy in self.proxies.items():
            if not name or name in (a, b):
                proxy.unblock()
        self.note(f"healed {name or 'every link'}")

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        self.procs.clear()

    # --- conditions --------------------------------------------------------------------------------------------

    async def caught_up(self, names: tuple[str, ...], hw_too: bool = False) -> bool:
        record = self.record()
        if record is None or not record.leader or record.leader not in self.procs:
            return False
        top = await self.status(record.leader)
        if top.role != "leader" or top.epoch != record.epoch or set(names) - set(top.isr):
            return False
        if hw_too and top.hw != top.leo:
            return False
        for name in names:
            if name != record.leader and (await self.status(name)).leo != top.leo:
                return False
        return True

    async def wait_for(self, what: str, condition: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
        with trio.move_on_after(timeout_s):
            while not await condition():
                await trio.sleep(0.05)
            return
        raise StepFailed(f"timed out after {timeout_s:.0f} s waiting for {what}")

    async def role_is(self, name: str, role: str) -> bool:
        record = self.record()
        if name not in self.procs or record is None:
            return False
        status = await self.status(name)
        return status.role == role and status.epoch == record.epoch


async def run_step(cluster: MirrorCluster, step: MirrorStep) -> None:
    target = step.target
    timeout_s = step.timeout_s or WAIT_TIMEOUT_S
    if step.action == "publish":
        for msg in step.messages:
            if step.wait:
                result = await cluster.publish(msg, step.timeout_s or PUBLISH_TIMEOUT_S)
                outcome = "no answer" if result is None else (
                    f"confirmed at offset {result.offset}" if result.ok else f"nacked ({result.reason})")
                cluster.note(f"publish {msg}: {outcome}")
            else:
                cluster.publish_nowait(msg)
                cluster.note(f"publish {msg}: sent, not waiting")
    elif step.action == "wait":
        await trio.sleep(step.seconds)
    elif step.action == "wait-caught-up":
        names = tuple(n for n in cluster.spec.replicas if n in cluster.procs)
        await cluster.wait_for("every live replica caught up", lambda: cluster.caught_up(names), timeout_s)
    elif step.action == "wait-live":
        async def live() -> bool:
            return target in cluster.greeted
        await cluster.wait_for(f"{target} known live to the controller (its hello)", live, timeout_s)
    elif step.action == "wait-role":
        await cluster.wait_for(f"{target} {step.role}", lambda: cluster.role_is(target, step.role), timeout_s)
    elif step.action == "wait-out-of-isr":
        async def out() -> bool:
            record = cluster.record()
            return record is not None and target not in record.isr
        await cluster.wait_for(f"{target} out of the ISR", out, timeout_s)
    elif step.action == "wait-leo":
        async def leo() -> bool:
            return (await cluster.status(target)).leo >= step.leo
        await cluster.wait_for(f"{target} LEO {step.leo}", leo, timeout_s)
    elif step.action == "kill":
        cluster.kill(target)
    elif step.action == "restart":
        if target in cluster.procs:
            cluster.kill(target)
        cluster.start(target)
    elif step.action == "isolate":
        cluster.isolate(target)
    elif step.action == "heal":
        cluster.heal(target)
    elif step.action == "transfer":
        moved = await cluster.commit(TransferMirror(VHOST, QUEUE, target, tuple(sorted(cluster.procs))))
        if moved.refused:
            raise StepFailed(f"transfer to {target} refused: {moved.refused}")
        cluster.controller.broadcast()


@dataclass(frozen=True, slots=True)
class MirrorRun:
    check: MirrorCheck
    settings: dict[str, dict[str, Any]]
    events: tuple[str, ...]
    duration_s: float


async def run_mirror_async(spec: MirrorSpec, directory: Path, unsafe: bool = False,
                           overrides: dict[str, Any] | None = None) -> MirrorRun:
    """Run one scenario; its replicas' files and logs go under `directory`."""
    settings = {name: spec.settings_for(name, unsafe, dict(overrides or {})) for name in spec.replicas}
    for values in settings.values():
        try:
            Settings(**{k: v for k, v in values.items() if k in SETTINGS_FIELDS})
        except TypeError as error:
            raise MirrorScenarioError(f"bad settings: {error}") from None
    directory.mkdir(parents=True, exist_ok=True)
    cluster = MirrorCluster(spec, settings, directory)
    problems: list[str] = []
    logs: dict[str, list[Record]] = {}
    leader, hw = "", 0
    try:
        async with trio.open_nursery() as nursery:
            for proxy in cluster.proxies.values():
                await nursery.start(proxy.serve)
            await nursery.start(cluster.transport.serve, "127.0.0.1", cluster.ctl_port)
            nursery.start_soon(cluster.controller.run)
            for name in spec.replicas:
                cluster.start(name)
            try:
                await cluster.wait_for("every replica caught up", lambda: cluster.caught_up(spec.replicas),
                                       WAIT_TIMEOUT_S)
                for step in spec.steps:
                    cluster.note(f"step {step.action} {step.target}".rstrip())
                    await run_step(cluster, step)
            except StepFailed as error:
                problems.append(f"step failed: {error}")
                cluster.note(problems[-1])
            cluster.heal()
            for name in spec.replicas:
                if name not in cluster.procs:
                    cluster.start(name)
            try:
                await cluster.wait_for("the replicas to settle", lambda: cluster.caught_up(spec.replicas, True),
                                       SETTLE_TIMEOUT_S)
            except StepFailed as error:
                problems.append(f"did not settle: {error}")
            record = cluster.record()
            leader = record.leader if record is not None else ""
            for name in spec.replicas:
                status = await cluster.status(name, with_log=True)
                logs[name] = list(status.log)
                if name == leader:
                    hw = status.hw
            cluster.stop_all()
            for name in spec.replicas:
                on_disk = list(ReplicaStore(directory / name / "replica").load().log)
                if logs[name][: len(on_disk)] != on_disk:
                    problems.append(f"{name}: its files do not hold a prefix of what it served")
                logs[name] = on_disk + logs[name][len(on_disk):]  # the unflushed tail: the process's page cache
            nursery.cancel_scope.cancel()
    finally:
        cluster.stop_all()
    confirmed = {msg: r.offset for msg, r in cluster.results.items() if r.ok}
    counts = {"published": len(set(cluster.sent)), "confirmed": len(confirmed),
              "nacked": sum(1 for r in cluster.results.values() if not r.ok),
              "unanswered": len(set(cluster.sent) - set(cluster.results))}
    check = check_mirror(confirmed, logs, leader, hw, problems, counts)
    return MirrorRun(check, settings, tuple(cluster.events), time.monotonic() - cluster.started)


def report_text(name: str, run: MirrorRun, label: str) -> str:
    c = run.check
    lines = [f"{name} [{label}]: {'PASS' if c.valid else 'FAIL'}",
             f"  published {c.counts.get('published', 0)}, confirmed {c.counts.get('confirmed', 0)}, "
             f"nacked {c.counts.get('nacked', 0)}, unanswered {c.counts.get('unanswered', 0)}; "
             f"leader {c.leader or '-'}, HW {c.hw}; {run.duration_s:.1f} s"]
    lines += [f"  lost: {item}" for item in c.lost]
    lines += [f"  diverged: {item}" for item in c.diverged]
    lines += [f"  short: {item}" for item in c.short]
    lines += [f"  problem: {item}" for item in c.problems]
    return "\n".join(lines) + "\n"


def write_report(out_dir: Path, name: str, run: MirrorRun, label: str) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    text = report_text(name, run, label)
    (out_dir / "report.txt").write_text(text + "\nevents:\n" + "\n".join(run.events) + "\n")
    (out_dir / "report.json").write_text(json.dumps(
        {"scenario": name, "variant": label, **run.check.summary(), "settings": run.settings,
         "duration_s": round(run.duration_s, 2), "events": list(run.events)}, indent=2))
    return text


def run_mirror(name: str, spec: MirrorSpec, out_dir: Path, unsafe: bool = False,
               overrides: dict[str, Any] | None = None) -> MirrorRun:
    """`raftmq chaos run` for a `[mirror]` scenario: run it, write and print the report."""
    label = ", ".join([*(["unsafe: " + json.dumps(spec.unsafe, sort_keys=True)] if unsafe else []),
                       *(f"{k}={v}" for k, v in sorted((overrides or {}).items()))]) or "defaults"
    replicas = out_dir / "replicas"
    if replicas.exists():
        shutil.rmtree(replicas)  # a previous run's files: every run starts from empty replicas
    run = trio.run(run_mirror_async, spec, replicas, unsafe, overrides)
    print(write_report(out_dir, name, run, label), end="")
    print(f"  report: {out_dir}")
    if os.environ.get("RAFTMQ_CHAOS_EVENTS"):
        print("\n".join(run.events))
    return run
