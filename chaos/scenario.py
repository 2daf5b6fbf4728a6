"""Declarative fault schedules: scenario files (TOML), random schedules from a seed, and the nemesis that runs them.

How it works: a scenario names a workload (queues, publishers, consumers, messages, durability, queue type) and a
list of steps, run `loop` times while the workload publishes; afterwards every fault is healed (paused nodes
resumed, killed nodes restarted, partitions healed, toxics removed), the publishers finish, every queue is drained
and the checker judges the history. Steps (`action`): wait {seconds, or confirmed = N: until N publishes are confirmed,
or more_confirmed = N: until N more than when the step began, or queue_leader = true: until the live nodes name
a leader of the first queue}; kill {target} (SIGKILL); pause {target}
(SIGSTOP); resume {target} (SIGCONT; target "paused" = every paused node); restart {target} (kill -9 if running,
then start the same command; the targets are all started before waiting for any, so nodes that need each other
to answer can come back together; target "down" = every killed node); partition {shape}; heal; toxic-add {proxy, toxic
= {type, stream, attributes, ...}}; toxic-remove {proxy, name}. Targets: leader-of-queue (of the first queue),
follower-of-queue (a member other than the leader), random, minority, majority, all, a node name or a
comma-separated list of node names ("rmq2,rmq3"); a partition of
shape "isolate" cuts off its target (leader-of-queue, a node name...; default random). Every random choice comes from one random.Random(seed), so a
schedule replays exactly. Every action is recorded in the history as a Fault record.
A deployment may add target kinds of its own (`named_targets`, e.g. chaos/shovel.py's `shovel-node`); a toxic step's
`proxy` may list several proxies, comma-separated. A `[shovel]` table makes the scenario a shovel scenario
(chaos/shovel.py: two clusters and a shovel, with its own fault proxy, so its toxic steps need no --fault-proxy); a
`[federation]` table likewise a federation scenario (chaos/federation.py: two clusters and a federation link), a
`[federation_ring]` table one with three clusters federated in a ring (chaos/federation_ring.py).
A `[mirror]` table makes it a mirrored-queue scenario on replica processes, with steps of its own
(chaos/mirror_run.py).
A scenario's `[node_settings]` (node setting name = value, e.g. test_unsafe_confirm_before_commit = true) become
command-line options of every node the harness starts; a setting named test_unsafe_* marks the scenario as
deliberately unsafe (`expect_loss`): it exists to show that the checker catches what such a mode loses.
"""

from __future__ import annotations

import json
import random
import time
import tomllib
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from chaos import netns
from chaos.nemesis import Cluster, pick_targets
from chaos.workload import Recorder, WorkloadConfig

ACTIONS = ("wait", "kill", "pause", "resume", "restart", "partition", "heal", "toxic-add", "toxic-remove")
SCENARIO_DIR = Path(__file__).parent / "scenarios"
STEPS_MAX = 10_000
HTTP_TIMEOUT_S = 10.0
WAIT_CONFIRMED_TIMEOUT_S = 60.0


class ScenarioError(ValueError):
    pass


class Partitioner(Protocol):
    def partition(self, blocked: set[frozenset[str]]) -> None: ...
    def heal(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Step:
    action: str
    target: str = "random"
    seconds: float = 0.0
    shape: str = "halves"
    proxy: str = ""
    name: str = ""
    toxic: dict[str, Any] = field(default_factory=dict)
    confirmed: int = 0
    more_confirmed: int = 0
    queue_leader: bool = False

    def describe(self) -> str:
        if self.action == "wait":
            return f"wait {self.seconds}s"
        if self.action == "partition":
            return f"partition {self.shape}"
        if self.action.startswith("toxic"):
            return f"{self.action} {self.proxy} {self.name or self.toxic.get('type', '')}"
        return f"{self.action} {self.target}" if self.action != "heal" else "heal"


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    nodes: int
    workload: dict[str, Any]
    steps: tuple[Step, ...]
    loop: int = 1
    seed: int = 0
    publish_timeout_s: float = 120.0
    node_settings: dict[str, Any] = field(default_factory=dict)
    shovel: dict[str, Any] | None = None  # `[shovel]`: two clusters and a shovel between them (chaos/shovel.py)
    mirror: dict[str, Any] | None = None  # `[mirror]`: a mirrored-queue scenario on replica processes (mirror_run)
    federation: dict[str, Any] | None = None  # `[federation]`: two clusters and a federation link (chaos/federation.py)
    federation_ring: dict[str, Any] | None = None  # `[federation_ring]`: three clusters federated in a ring
    # (chaos/federation_ring.py)

    @property
    def two_clusters(self) -> bool:
        """A shovel or federation scenario: it starts its two clusters and its fault proxy itself."""
        return self.shovel is not None or self.federation is not None or self.federation_ring is not None

    def node_args(self) -> tuple[str, ...]:
        """`[node_settings]` as `raftmq node` options (`--test-unsafe-confirm-before-commit true`)."""
        args: list[str] = []
        for name, value in sorted(self.node_settings.items()):
            text = str(value).lower() if isinstance(value, bool) else str(value)
            args += ["--" + name.replace("_", "-"), text]
        return tuple(args)

    @property
    def expect_loss(self) -> bool:
        """Deliberately unsafe (a truthy test_unsafe_* node setting): the checker is expected to fail the run."""
        return any(name.startswith("test_unsafe_") and bool(value) for name, value in self.node_settings.items())

    def needs(self) -> set[str]:
        """Capabilities the steps need beyond process control: "netns" (partitions), "toxiproxy" (toxics)."""
        needed = set()
        for step in self.steps:
            if step.action in ("partition", "heal"):
                needed.add("netns")
            if step.action.startswith("toxic") and not self.two_clusters:  # a shovel scenario brings its fault proxy
                needed.add("toxiproxy")
        return needed

    def workload_config(self, urls: tuple[str, ...]) -> WorkloadConfig:
        options = dict(self.workload)
        queue_type = options.pop("queue_type", None)
        arguments = dict(options.pop("queue_arguments", {}))
        if queue_type:
            arguments["x-queue-type"] = queue_type
        if "queues" in options:
            options["queues"] = tuple(options["queues"])
        try:
            return WorkloadConfig(urls=urls, queue_arguments=arguments, run_id=f"{self.name}-{self.seed}", **options)
        except TypeError as error:
            raise ScenarioError(f"scenario {self.name}: bad workload option: {error}")


def parse_step(raw: dict[str, Any]) -> Step:
    action = raw.get("action")
    if action not in ACTIONS:
        raise ScenarioError(f"unknown action {action!r}: expected one of {ACTIONS}")
    known = {"action", "target", "seconds", "shape", "proxy", "name", "toxic", "confirmed", "more_confirmed",
             "queue_leader"}
    unknown = set(raw) - known
    if unknown:
        raise ScenarioError(f"step {action}: unknown keys {sorted(unknown)}")
    if raw.get("shape", "halves") not in netns.SHAPES:
        raise ScenarioError(f"unknown partition shape {raw['shape']!r}: expected one of {netns.SHAPES}")
    if action.startswith("toxic") and not raw.get("proxy"):
        raise ScenarioError(f"step {action} needs a proxy name")
    return Step(action, str(raw.get("target", "random")), float(raw.get("seconds", 0.0)),
                str(raw.get("shape", "halves")), str(raw.get("proxy", "")), str(raw.get("name", "")),
                dict(raw.get("toxic", {})), int(raw.get("confirmed", 0)), int(raw.get("more_confirmed", 0)),
                bool(raw.get("queue_leader", False)))


def parse_scenario(text: str, default_name: str = "scenario") -> Scenario:
    raw = tomllib.loads(text)
    steps = tuple(parse_step(step) for step in raw.get("steps", []))
    loop = int(raw.get("loop", 1))
    if len(steps) * loop > STEPS_MAX:
        raise ScenarioError(f"too many steps ({len(steps)} x {loop}); at most {STEPS_MAX}")
    settings = dict(raw.get("node_settings", {}))
    for name, value in settings.items():
        if not name.replace("_", "").isalnum() or not isinstance(value, (bool, int, float, str)):
            raise ScenarioError(f"node setting {name!r}: expected a setting name and a plain value")
    if "mirror" in raw:  # refused at load time like any bad scenario (the runner itself is loaded on use)
        from chaos.mirror_run import MirrorScenarioError, parse_mirror

        try:
            parse_mirror(dict(raw["mirror"]))
        except MirrorScenarioError as error:
            raise ScenarioError(str(error)) from None
        if "broker" in raw["mirror"]:  # its version through the broker (chaos/mirror_broker.py)
            from chaos.mirror_broker import BrokerScenarioError, parse_broker

            try:
                parse_broker(dict(raw["mirror"]["broker"]))
            except BrokerScenarioError as error:
                raise ScenarioError(f"[mirror.broker]: {error}") from None
    return Scenario(name=str(raw.get("name", default_name)), description=str(raw.get("description", "")),
                    nodes=int(raw.get("nodes", 1)), workload=dict(raw.get("workload", {})), steps=steps,
                    loop=loop, seed=int(raw.get("seed", 0)),
                    publish_timeout_s=float(raw.get("publish_timeout_s", 120.0)), node_settings=settings,
                    shovel=dict(raw["shovel"]) if "shovel" in raw else None,
                    federation=dict(raw["federation"]) if "federation" in raw else None,
                    federation_ring=dict(raw["federation_ring"]) if "federation_ring" in raw else None,
                    mirror=dict(raw["mirror"]) if "mirror" in raw else None)


def load_scenario(name_or_path: str) -> Scenario:
    """A path to a .toml file, or the name of a bundled scenario (chaos/scenarios/<name>.toml)."""
    path = Path(name_or_path)
    if not path.exists():
        path = SCENARIO_DIR / f"{name_or_path}.toml"
    if not path.exists():
        raise ScenarioError(f"no scenario {name_or_path!r} (bundled: {', '.join(bundled_scenarios())})")
    return parse_scenario(path.read_text(), default_name=path.stem)


def bundled_scenarios() -> list[str]:
    return sorted(path.stem for path in SCENARIO_DIR.glob("*.toml"))


def random_scenario(seed: int, rounds: int = 5, nodes: int = 3, faults: tuple[str, ...] = ("kill", "pause"),
                    workload: dict[str, Any] | None = None) -> Scenario:
    """A random schedule: each round waits, injects one fault, waits, and undoes it (all from the seed)."""
    rng = random.Random(seed)
    steps: list[Step] = []
    undo = {"kill": "restart", "pause": "resume", "restart": "wait", "partition": "heal"}
    for _ in range(rounds):
        fault = rng.choice(faults)
        target = rng.choice(["leader-of-queue", "random", "minority"])
        steps.append(Step("wait", seconds=round(rng.uniform(0.3, 1.5), 2)))
        if fault == "partition":
            steps.append(Step("partition", shape=rng.choice(netns.SHAPES)))
        else:
            steps.append(Step(fault, target=target))
        steps.append(Step("wait", seconds=round(rng.uniform(0.3, 1.5), 2)))
        after = undo[fault]
        if after != "wait":
            steps.append(Step(after, target="down" if after == "restart" else "paused"))
    return Scenario(f"random-{seed}", f"{rounds} random rounds of {', '.join(faults)}", nodes,
                    dict(workload or {}), tuple(steps), seed=seed)


class Nemesis:
    """Carries out steps against a cluster, remembering what to heal."""

    def __init__(self, cluster: Cluster, recorder: Recorder, rng: random.Random, queue: str | None = None,
                 partitioner: Partitioner | None = None, toxiproxy_url: str | None = None) -> None:
        self.cluster, self.recorder, self.rng, self.queue = cluster, recorder, rng, queue
        self.partitioner, self.toxiproxy_url = partitioner, toxiproxy_url
        self.down: set[str] = set()
        self.paused: set[str] = set()
        self.partitioned = False
        self.toxics: set[tuple[str, str]] = set()

    def targets(self, target: str) -> list[str]:
        if target == "down":
            return sorted(self.down)
        if target == "paused":
            return sorted(self.paused)
        named = getattr(self.cluster, "named_targets", None)  # deployment-specific kinds (chaos/shovel.py)
        found = named(target) if named is not None else None
        if found is not None:
            return list(found)
        return pick_targets(self.cluster, target, self.rng, self.queue)

    def apply(self, step: Step) -> None:
        if step.action == "wait":
            self._wait(step)
            return
        handler = getattr(self, "_" + step.action.replace("-", "_"))
        handler(step)

    def _wait(self, step: Step) -> None:
        """Sleep `seconds`; with `confirmed = N`, until N publishes are confirmed, with `more_confirmed = N` until N
        more than now, with `queue_leader`, until the live nodes name a leader of the queue (`seconds`, else 60 s,
        at most)."""
        if step.queue_leader:
            self._wait_queue_leader(step.seconds or WAIT_CONFIRMED_TIMEOUT_S)
            return
        if step.confirmed <= 0 and step.more_confirmed <= 0:
            time.sleep(step.seconds)
            return
        wanted = max(step.confirmed, self.recorder.confirmed_count + step.more_confirmed)
        deadline = time.monotonic() + (step.seconds or WAIT_CONFIRMED_TIMEOUT_S)
        while time.monotonic() < deadline:
            if self.recorder.confirmed_count >= wanted:
                return
            time.sleep(0.02)
        raise ScenarioError(f"wait: fewer than {wanted} publishes confirmed in time (the broker stalled, or the "
                            f"publishers ran out of messages: then use messages_per_publisher = 0, which publishes until the "
                            f"steps are over)")

    def _wait_queue_leader(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = self.cluster.leader_of(self.queue) if self.queue else None
            if leader is not None:
                self.recorder.fault("leader", leader, self.queue or "")
                return
            time.sleep(0.1)
        raise ScenarioError(f"wait: no leader of queue {self.queue} named within {timeout_s} s")

    def _kill(self, step: Step) -> None:
        for node in self.targets(step.target):
            self.recorder.fault("kill", node, step.target)
            self.cluster.kill(node)
            self.down.add(node)
            self.paused.discard(node)

    def _pause(self, step: Step) -> None:
        for node in self.targets(step.target):
            if node not in self.down:
                self.recorder.fault("pause", node, step.target)
                self.cluster.pause(node)
                self.paused.add(node)

    def _resume(self, step: Step) -> None:
        for node in self.targets(step.target):
            self.recorder.fault("resume", node)
            self.cluster.resume(node)
            self.paused.discard(node)

    def _restart(self, step: Step) -> None:
        nodes = self.targets(step.target)
        for node in nodes:
            if node not in self.down:
                self.recorder.fault("restart", node, step.target)
        restart_many = getattr(self.cluster, "restart_many", None)
        if restart_many is not None:
            restart_many(nodes)  # all started, then waited for: nodes that need each other come back together
        for node in nodes:
            if restart_many is None:
                self.cluster.restart(node)
            self.down.discard(node)
            self.paused.discard(node)
            self.recorder.fault("up", node)

    def _partition(self, step: Step) -> None:
        if self.partitioner is None:
            raise ScenarioError("partition steps need network namespaces (run with --netns, as root)")
        label = step.shape
        if step.shape == "isolate":
            isolated = self.targets(step.target)[0]
            blocked = netns.isolate_pairs(isolated, self.cluster.nodes())
            label = f"isolate {isolated}"
        else:
            blocked = netns.partition_pairs(step.shape, self.cluster.nodes(), self.rng)
        detail = " ".join(sorted("|".join(sorted(pair)) for pair in blocked))
        self.recorder.fault("partition", label, detail)
        self.partitioner.partition(blocked)
        self.partitioned = True

    def _heal(self, step: Step) -> None:
        if self.partitioner is not None:
            self.recorder.fault("heal", "network")
            self.partitioner.heal()
        self.partitioned = False

    def _toxic_add(self, step: Step) -> None:
        """The toxic on the proxy, or on each of a comma-separated list of proxies."""
        body = dict(step.toxic)
        body.setdefault("name", step.name or f"{body.get('type')}_{body.get('stream', 'downstream')}")
        for proxy in step.proxy.split(","):
            self._toxiproxy("POST", f"/proxies/{proxy}/toxics", body)
            self.toxics.add((proxy, str(body["name"])))
            self.recorder.fault("toxic-add", proxy, json.dumps(body, sort_keys=True))

    def _toxic_remove(self, step: Step) -> None:
        for proxy in step.proxy.split(","):
            self._toxiproxy("DELETE", f"/proxies/{proxy}/toxics/{step.name}", None)
            self.toxics.discard((proxy, step.name))
            self.recorder.fault("toxic-remove", proxy, step.name)

    def _toxiproxy(self, method: str, path: str, body: Any) -> None:
        if not self.toxiproxy_url:
            raise ScenarioError("toxic steps need a Toxiproxy API (--toxiproxy http://host:8474)")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.toxiproxy_url.rstrip("/") + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            response.read()

    def heal_all(self) -> None:
        """Undo every fault still in place: resume, restart, heal the network, remove toxics."""
        if self.paused:
            self._resume(Step("resume", target="paused"))
        if self.down:
            self._restart(Step("restart", target="down"))
        if self.partitioned:
            self._heal(Step("heal"))
        for proxy, name in sorted(self.toxics):
            self._toxic_remove(Step("toxic-remove", proxy=proxy, name=name))
