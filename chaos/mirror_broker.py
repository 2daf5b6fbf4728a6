"""Mirrored-queue chaos scenarios through the broker: a 3-node raftmq cluster, AMQP publishes with confirms.

What it is for: `raftmq chaos run hw-truncation-loss --via broker` (and `unclean-election-loss`) runs the scenario
on real broker nodes instead of the harness's replica processes (chaos/mirror_run.py): three `raftmq node`
processes in one cluster, the queue made mirrored by an `ha-*` policy (ha-mode exactly 2: replicas a = rmq1, the
declaring node and first leader, and b = rmq2; rmq3 is an observer that every publish goes through, so it is never
faulted and keeps the metadata group's majority), publishes with confirms over AMQP (pika), faults on whole nodes
(kill -9, SIGSTOP/SIGCONT, restart) at moments decided from the broker's management view (each node's /api/queues
row: its role, epoch, ISR, HW and LEO). Afterwards every killed node is restarted, every paused one resumed, the
run waits until the replicas are in the ISR at the leader's LEO with the HW there, reads every replica's log from
its files (cluster/mirror_queues/runtime/storage.py `read_records`; the queue log entries decoded to message
bodies) and checks them as the harness does (chaos/mirror_check.py): confirmed messages the leader does not hold
below its HW, offsets below the HW where the replicas differ.

How it works: a scenario's `[mirror.broker]` table holds the policy (`policy`, RabbitMQ's ha-* keys), the node
settings every node gets (`node_settings`, `raftmq node` options) and those of one replica's node
(`[mirror.broker.replica_settings.b]`), the policy keys of the unsafe variant (`unsafe`) and the steps
(`[[mirror.broker.steps]]`): publish {messages, timeout_s}; wait {seconds}; pause/resume/kill/restart {target};
wait-status {target, role, epoch, leo, hw, checkpoint: the target node's own row says so}; wait-out-of-isr
{target: the committed ISR leaves it out}. Variants run side by side on one cluster: each is its own queue
(`mirror-<label>`, its own policy), and every step applies to every queue (a publish goes to each; a wait holds
for each), so one cluster and one fault schedule give both verdicts (the CI test runs the shipped and the unsafe
variant together). Confirms: the publish went through rmq3, whose replica applied it below the HW.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pika
import pika.exceptions

from chaos.mirror_check import MirrorCheck, divergence
from chaos.nemesis import LocalCluster
from chaos.run import free_base_port
from cluster.mirror_queues.core.types import Record
from cluster.mirror_queues.runtime.storage import read_records
from cluster.queue.envelope import EnvelopeDecodeError
from cluster.queue.group_ids import parse_queue_group_id
from cluster.queue.types import Enqueue, EnqueueMany
from node.broker.replica_wire import envelope_codec
from node.ctl import Client, CtlError

NODES = {"a": "rmq1", "b": "rmq2", "c": "rmq3"}  # the scenario's replica names -> the cluster's nodes
VIA = "c"  # every publish goes through this node (an observer for `exactly 2`)
ACTIONS = ("publish", "wait", "pause", "resume", "kill", "restart", "wait-status", "wait-out-of-isr")
WAIT_TIMEOUT_S = 60.0
SETTLE_TIMEOUT_S = 90.0
PUBLISH_TIMEOUT_S = 15.0
HTTP_TIMEOUT_S = 5.0  # one management request
DEFAULT_NODE_SETTINGS = {
    "node_down_after_ms": 60_000,  # a paused node is not declared down by silence: the steps decide the faults
    "mirror_replace_after_ms": 0,  # a killed replica is restarted by the steps, not replaced by rmq3
    "proposal_timeout_ms": 4_000,  # a publish to a queue nobody may lead is nacked after this
}


class BrokerScenarioError(ValueError):
    pass


class StepFailed(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class BrokerStep:
    action: str
    target: str = ""
    messages: tuple[str, ...] = ()
    timeout_s: float = 0.0
    seconds: float = 0.0
    role: str = ""
    epoch: int = -1
    leo: int = -1
    hw: int = -1
    checkpoint: int = -1  # the target's HW checkpoint (its row's hw_checkpoint)


@dataclass(frozen=True, slots=True)
class BrokerSpec:
    policy: dict[str, Any]
    steps: tuple[BrokerStep, ...]
    node_settings: dict[str, Any] = field(default_factory=dict)
    replica_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    unsafe: dict[str, Any] = field(default_factory=dict)

    def node_args(self) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
        """(every node's `raftmq node` options, each node's own)."""
        return (_args({**DEFAULT_NODE_SETTINGS, **self.node_settings}),
                {NODES[name]: _args(values) for name, values in self.replica_settings.items()})


def _args(settings: Mapping[str, Any]) -> tuple[str, ...]:
    out: list[str] = []
    for name, value in sorted(settings.items()):
        out += ["--" + name.replace("_", "-"), str(value).lower() if isinstance(value, bool) else str(value)]
    return tuple(out)


def parse_broker(raw: dict[str, Any]) -> BrokerSpec:
    steps = []
    known = set(BrokerStep.__dataclass_fields__)
    for step in raw.get("steps", []):
        action = step.get("action")
        if action not in ACTIONS:
            raise BrokerScenarioError(f"unknown broker step {action!r}: expected one of {ACTIONS}")
        if set(step) - known:
            raise BrokerScenarioError(f"broker step {action}: unknown keys {sorted(set(step) - known)}")
        target = str(step.get("target", ""))
        if target and target not in NODES:
            raise BrokerScenarioError(f"broker step {action}: unknown replica {target!r} (a, b or c)")
        steps.append(BrokerStep(action, target, tuple(str(m) for m in step.get("messages", ())),
                                float(step.get("timeout_s", 0.0)), float(step.get("seconds", 0.0)),
                                str(step.get("role", "")), int(step.get("epoch", -1)), int(step.get("leo", -1)),
                                int(step.get("hw", -1)), int(step.get("checkpoint", -1))))
    policy = dict(raw.get("policy", {}))
    if "ha-mode" not in policy:
        raise BrokerScenarioError("[mirror.broker] policy: needs ha-mode")
    replica_settings = {str(k): dict(v) for k, v in raw.get("replica_settings", {}).items()}
    if set(replica_settings) - set(NODES):
        raise BrokerScenarioError("[mirror.broker.replica_settings]: a, b or c")
    return BrokerSpec(policy, tuple(steps), dict(raw.get("node_settings", {})), replica_settings,
                      dict(raw.get("unsafe", {})))


def variant_policy(spec: BrokerSpec, unsafe: bool, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The policy definition of one variant: the scenario's, the unsafe keys, then `--truncation`/`--promote`."""
    policy = {**spec.policy, **(spec.unsafe if unsafe else {})}
    if overrides.get("truncation"):
        policy["ha-truncation"] = overrides["truncation"]
    if overrides.get("promote_on_failure"):
        policy["ha-promote-on-failure"] = overrides["promote_on_failure"]
    return policy


# --- the cluster's management view ----------------------------------------------------------------------------


def _api(port: int) -> Client:
    return Client(f"127.0.0.1:{port}", "guest", "guest", HTTP_TIMEOUT_S)


def _policy_is_there(port: int, queue: str) -> bool:
    try:
        _api(port).call("GET", f"/api/policies/%2F/{quote(queue)}")
    except CtlError:
        return False
    return True


class BrokerRun:
    """One cluster, one queue per variant, the steps, the events."""

    def __init__(self, cluster: LocalCluster, queues: dict[str, str]) -> None:
        self.cluster = cluster
        self.queues = queues  # label -> queue name
        self.started = time.monotonic()
        self.events: list[str] = []
        self.sent: dict[str, list[str]] = {q: [] for q in queues.values()}
        self.confirmed: dict[str, list[str]] = {q: [] for q in queues.values()}
        self.nacked: dict[str, list[str]] = {q: [] for q in queues.values()}
        self.paused: set[str] = set()
        self.killed: set[str] = set()

    def note(self, text: str) -> None:
        self.events.append(f"{time.monotonic() - self.started:7.2f}s {text}")

    def row(self, node: str, queue: str) -> dict[str, Any] | None:
        """The node's own mirror status of the queue (None: unreachable, or not there yet)."""
        if node in self.paused or node in self.killed:
            return None
        try:
            row = _api(self.cluster.management_address(node)[1]).call("GET", f"/api/queues/%2F/{quote(queue)}")
        except CtlError:
            return None
        mirror = row.get("mirror") if isinstance(row, dict) else None
        return mirror if isinstance(mirror, dict) else None

    def wait_for(self, what: str, condition: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise StepFailed(f"timed out after {timeout_s:.0f} s waiting for {what}")
            time.sleep(0.1)

    def publish(self, messages: tuple[str, ...], timeout_s: float) -> None:
        """Each message to each queue through rmq3 with confirms; nacked or unanswered ones are not confirmed."""
        port = self.cluster.spec(NODES[VIA]).port
        for queue in self.queues.values():
            for msg in messages:
                self.sent[queue].append(msg)
                outcome = _publish_one(port, queue, msg, timeout_s)
                (self.confirmed if outcome == "confirmed" else self.nacked)[queue].append(msg)
                self.note(f"publish {msg} to {queue}: {outcome}")


def _publish_one(port: int, queue: str, msg: str, timeout_s: float) -> str:
    params = pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1, socket_timeout=5,
                                       blocked_connection_timeout=timeout_s)
    try:
        with pika.BlockingConnection(params) as conn:
            ch = conn.channel()
            ch.confirm_delivery()  # the broker answers within its proposal_timeout_ms (a nack when unavailable)
            ch.basic_publish("", queue, msg.encode(), pika.BasicProperties(delivery_mode=2), mandatory=True)
            return "confirmed"
    except pika.exceptions.NackError:
        return "nacked"
    except pika.exceptions.UnroutableError:
        return "unroutable"
    except (pika.exceptions.AMQPError, OSError) as error:
        return f"no answer ({type(error).__name__})"


def run_step(run: BrokerRun, step: BrokerStep) -> None:
    node = NODES.get(step.target, "")
    timeout_s = step.timeout_s or WAIT_TIMEOUT_S
    if step.action == "publish":
        run.publish(step.messages, step.timeout_s or PUBLISH_TIMEOUT_S)
    elif step.action == "wait":
        time.sleep(step.seconds)
    elif step.action == "pause":
        run.cluster.pause(node)
        run.paused.add(node)
    elif step.action == "resume":
        run.cluster.resume(node)
        run.paused.discard(node)
    elif step.action == "kill":
        run.cluster.kill(node)
        run.killed.add(node)
    elif step.action == "restart":
        run.cluster.restart(node)
        run.killed.discard(node)
    elif step.action == "wait-status":
        def status_is() -> bool:
            for queue in run.queues.values():
                row = run.row(node, queue)
                if row is None or (step.role and row.get("role") != step.role) or (
                        step.epoch >= 0 and row.get("epoch") != step.epoch) or (
                        step.leo >= 0 and row.get("leo", {}).get(node) != step.leo) or (
                        step.hw >= 0 and row.get("hw") != step.hw) or (
                        step.checkpoint >= 0 and row.get("hw_checkpoint") != step.checkpoint):
                    return False
            return True
        run.wait_for(f"{node}: role {step.role or '*'} epoch {step.epoch} LEO {step.leo} HW {step.hw} "
                     f"checkpoint {step.checkpoint}", status_is, timeout_s)
    elif step.action == "wait-out-of-isr":
        def out() -> bool:
            rows = [run.row(NODES[VIA], queue) for queue in run.queues.values()]
            return all(row is not None and node not in row.get("isr", [node]) for row in rows)
        run.wait_for(f"{node} out of the ISR", out, timeout_s)
    run.note(f"step {step.action} {step.target}".rstrip() + " done")


# --- settle, read, check ----------------------------------------------------------------------------------------


def _settled(run: BrokerRun, queue: str) -> dict[str, Any] | None:
    """The leader's row once every replica is in the ISR at the leader's LEO and the HW is there."""
    for node in run.cluster.nodes():
        row = run.row(node, queue)
        if row is None or row.get("role") != "leader" or row.get("leader") != node:
            continue
        leo = row.get("leo", {})
        replicas = row.get("replicas", [])
        if set(replicas) <= set(row.get("isr", [])) and all(leo.get(r) == leo.get(node) for r in replicas) \
                and row.get("hw") == leo.get(node):
            return row
    return None


def _label(data: str) -> str:
    """A queue log entry as the checker names it: the message body of an Enqueue, else the command's type."""
    try:
        command = envelope_codec("chaos").decode(data.encode("latin-1")).command
    except EnvelopeDecodeError:
        return "<undecodable>"
    if isinstance(command, Enqueue):
        return bytes(command.message.payload.body).decode(errors="replace")
    if isinstance(command, EnqueueMany):
        return "+".join(bytes(m.payload.body).decode(errors="replace") for m in command.messages)
    return f"<{type(command).__name__}>"


def replica_log(data_dir: Path, queue: str) -> list[Record]:
    """The queue's mirror log as the node's files hold it (fsync: everything it acknowledged), bodies decoded."""
    for directory in sorted((data_dir / "mirror").glob("*")):
        try:
            _, name, _ = parse_queue_group_id(directory.name.replace("~", "/"))
        except ValueError:
            continue
        if name == queue:
            return [Record(offset, epoch, _label(payload)) for offset, epoch, payload in read_records(directory)]
    return []


def check_broker(confirmed: list[str], logs: Mapping[str, list[Record]], leader: str, hw: int,
                 problems: list[str], counts: dict[str, int]) -> MirrorCheck:
    """A confirmed message is lost when the leader does not hold it below its HW (an AMQP confirm carries no offset:
    named with its offset on a replica that had it, and what the leader holds there)."""
    below = [rec.msg for rec in logs.get(leader, [])[:hw]]
    lost = []
    for msg in confirmed:
        if msg in below:
            continue
        where = next((f"@{rec.offset}" for log in logs.values() for rec in log if rec.msg == msg), "")
        offset = int(where[1:]) if where else -1
        held = logs.get(leader, [])[offset].msg if 0 <= offset < len(logs.get(leader, [])) else None
        lost.append(f"{msg}{where} (leader {leader or '-'} has {held or 'nothing'} there)" if where
                    else f"{msg} (no replica holds it)")
    diverged, short = divergence(logs, hw)
    return MirrorCheck(tuple(lost), tuple(diverged), tuple(short), leader, hw, tuple(problems), counts)


@dataclass(frozen=True, slots=True)
class BrokerResult:
    checks: dict[str, MirrorCheck]  # label -> check of its queue
    policies: dict[str, dict[str, Any]]
    events: tuple[str, ...]
    duration_s: float


def run_broker(spec: BrokerSpec, directory: Path, variants: Mapping[str, dict[str, Any]]) -> BrokerResult:
    """Run the steps once on a new 3-node cluster under `directory`, one queue per variant (label -> policy)."""
    if directory.exists():
        shutil.rmtree(directory)  # a previous run's nodes: every run starts from empty nodes
    every, own = spec.node_args()
    began = time.monotonic()
    cluster = LocalCluster.spawn(directory, len(NODES), free_base_port(len(NODES)), every, clustered=True,
                                 node_args=own)
    queues = {label: f"mirror-{label}" for label in variants}
    run = BrokerRun(cluster, queues)
    run.note(f"cluster started in {time.monotonic() - began:.1f} s")
    problems: list[str] = []
    checks: dict[str, MirrorCheck] = {}
    try:
        _declare(run, variants)
        try:
            for step in spec.steps:
                run_step(run, step)
        except StepFailed as error:
            problems.append(f"step failed: {error}")
            run.note(problems[-1])
        for node in sorted(run.paused):
            cluster.resume(node)
        run.paused.clear()
        for node in sorted(run.killed):
            cluster.restart(node)
            run.note(f"restarted {node} to settle")
        run.killed.clear()
        for label, queue in queues.items():
            row: dict[str, Any] = {}

            def settled(queue: str = queue, row: dict[str, Any] = row) -> bool:
                row.update(_settled(run, queue) or {})
                return bool(row)
            try:
                run.wait_for(f"{queue} to settle", settled, SETTLE_TIMEOUT_S)
            except StepFailed as error:
                checks[label] = MirrorCheck(problems=(*problems, f"did not settle: {error}"))
                continue
            logs = {node: replica_log(Path(cluster.spec(node).data_dir), queue) for node in row["replicas"]}
            counts = {"published": len(run.sent[queue]), "confirmed": len(run.confirmed[queue]),
                      "nacked": len(run.nacked[queue]), "unanswered": 0}
            checks[label] = check_broker(run.confirmed[queue], logs, row["leader"], int(row["hw"]), problems,
                                         counts)
            run.note(f"{queue}: leader {row['leader']} epoch {row['epoch']} HW {row['hw']}; logs " + "; ".join(
                f"{n}: {[r.msg for r in log]}" for n, log in logs.items()))
    finally:
        for node in cluster.nodes():  # kill -9: the logs are read, nothing more to keep
            if cluster.pid(node) is not None:
                cluster.kill(node)
        cluster.stop_all()
    return BrokerResult(checks, dict(variants), tuple(run.events), time.monotonic() - run.started)


def _declare(run: BrokerRun, variants: Mapping[str, dict[str, Any]]) -> None:
    """A policy per variant and its queue, declared on rmq1 (so a = rmq1 leads epoch 0), then every replica ready."""
    first = NODES["a"]
    port = run.cluster.management_address(first)[1]
    for label, definition in variants.items():
        queue = run.queues[label]
        body = {"pattern": f"^{queue}$", "apply-to": "queues", "definition": definition}
        try:
            _api(port).call("PUT", f"/api/policies/%2F/{quote(queue)}", body)
        except CtlError as error:
            raise BrokerScenarioError(f"policy {definition} refused: {error}") from None
    run.wait_for("the policies on rmq1", lambda: all(_policy_is_there(port, q) for q in run.queues.values()),
                 WAIT_TIMEOUT_S)
    params = pika.ConnectionParameters("127.0.0.1", run.cluster.spec(first).port, connection_attempts=3,
                                       socket_timeout=5)
    with pika.BlockingConnection(params) as conn:
        ch = conn.channel()
        for queue in run.queues.values():
            ch.queue_declare(queue, durable=True)

    def ready() -> bool:
        for queue in run.queues.values():
            row = run.row(first, queue)
            if row is None or row.get("role") != "leader" or set(row.get("replicas", [])) - set(row.get("isr", [])):
                return False
            if any((run.row(n, queue) or {}).get("role") != "follower" for n in row["replicas"] if n != first):
                return False
        return True
    run.wait_for("every replica of every queue ready", ready, WAIT_TIMEOUT_S)
    run.note("queues declared: " + ", ".join(f"{q} {variants[label]}" for label, q in run.queues.items()))


def report_text(name: str, result: BrokerResult) -> str:
    lines = []
    for label, c in result.checks.items():
        lines += [f"{name} [via broker, {label}: {json.dumps(result.policies[label], sort_keys=True)}]: "
                  f"{'PASS' if c.valid else 'FAIL'}",
                  f"  published {c.counts.get('published', 0)}, confirmed {c.counts.get('confirmed', 0)}, "
                  f"nacked or unanswered {c.counts.get('nacked', 0)}; leader {c.leader or '-'}, HW {c.hw}"]
        lines += [f"  lost: {item}" for item in c.lost]
        lines += [f"  diverged: {item}" for item in c.diverged]
        lines += [f"  short: {item}" for item in c.short]
        lines += [f"  problem: {item}" for item in c.problems]
    lines.append(f"  ({result.duration_s:.1f} s)")
    return "\n".join(lines) + "\n"


def write_report(out_dir: Path, name: str, result: BrokerResult) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    text = report_text(name, result)
    (out_dir / "report.txt").write_text(text + "\nevents:\n" + "\n".join(result.events) + "\n")
    (out_dir / "report.json").write_text(json.dumps(
        {"scenario": name, "via": "broker", "variants": {label: {"policy": result.policies[label],
                                                                 **c.summary()} for label, c in result.checks.items()},
         "duration_s": round(result.duration_s, 2), "events": list(result.events)}, indent=2))
    return text
