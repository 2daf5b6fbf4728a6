"""Run one scenario end to end: environment, workload, nemesis, heal, drain, check.

How it works: `run_scenario` starts the workload against the given AMQP URLs, applies the scenario's steps `loop`
times, heals every fault (also when a step fails; a step that cannot be carried out, such as a wait for confirms
that never come, ends the steps, is recorded as an "error" fault and fails the run, which is still drained,
checked and reported), waits for the publishers to finish, drains every queue and
checks the history. An environment may carry `consumer_urls` (consumers elsewhere than the publishers), a `settle`
step run before the drain (a shovel environment waits there until its source queue is empty), and `copies` (the
checker then counts republished copies instead of failing on them); chaos/shovel.py builds such an environment.
`spawned_environment` is the environment `raftmq chaos run` uses when not pointed at a running
cluster: it starts the scenario's nodes itself in a temporary directory (each in its own network namespace when
partitions are wanted, which needs root) and removes them, and the namespaces, in a finally block.
`fault_proxy_front` puts our Toxiproxy-compatible fault proxy between the workload and every node.
"""

from __future__ import annotations

import json
import os
import random
import socket
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from chaos.checker import CheckResult, check
from chaos.faultproxy.background import FaultProxyThread
from chaos.history import Record, acks_of, split
from chaos.nemesis import Cluster, LocalCluster
from chaos.netns import NetLab
from chaos.scenario import Nemesis, Partitioner, Scenario, ScenarioError
from chaos.workload import Workload
from deploy.portshard import owned

NETNS_PORT = 5672


@dataclass(frozen=True, slots=True)
class RunOutcome:
    scenario: Scenario
    records: list[Record]
    result: CheckResult
    published_all: bool
    drained: bool
    overflowed: bool
    duration_s: float
    error: str | None = None

    @property
    def valid(self) -> bool:
        """Nothing lost, nothing unexpected, every step carried out, and the history complete enough to say so."""
        return self.result.valid and self.drained and not self.overflowed and self.error is None


@dataclass(frozen=True, slots=True)
class Environment:
    cluster: Cluster
    urls: tuple[str, ...]
    partitioner: Partitioner | None = None
    toxiproxy_url: str | None = None
    consumer_urls: tuple[str, ...] = ()  # consumers elsewhere than publishers (a shovel's destination cluster)
    settle: Callable[[], str | None] | None = None  # after the faults heal and publishing ends, before the drain:
    # waits for the deployment to finish moving messages (a shovel: the source queue empty); an error text or None
    copies: bool = False  # republished copies are expected (the checker counts them, chaos/checker.py)


def run_scenario(scenario: Scenario, env: Environment) -> RunOutcome:
    config = scenario.workload_config(env.urls)
    if env.consumer_urls:
        config = replace(config, consumer_urls=env.consumer_urls)
    workload = Workload(config)
    nemesis = Nemesis(env.cluster, workload.recorder, random.Random(scenario.seed), config.queues[0],
                      env.partitioner, env.toxiproxy_url)
    started_s = time.monotonic()
    workload.start()
    error = None
    try:
        for _ in range(scenario.loop):
            for step in scenario.steps:
                nemesis.apply(step)
    except ScenarioError as step_error:
        error = str(step_error)
        workload.recorder.fault("error", "nemesis", error)
    except BaseException:
        workload.stop()
        raise
    finally:
        nemesis.heal_all()
    if config.messages_per_publisher == 0:  # sized by duration: publishing ends with the steps
        workload.stop_publishing()
    published_all = workload.wait_published(scenario.publish_timeout_s)
    if env.settle is not None:
        workload.recorder.fault("settle", "deployment")
        settle_error = env.settle()
        if settle_error is not None:
            workload.recorder.fault("error", "settle", settle_error)
            error = error or settle_error
    drained = workload.drain()
    records = workload.records()
    publishes, deliveries, faults = split(records)
    result = check(publishes, deliveries, acks_of(records), faults, copies=env.copies)
    return RunOutcome(scenario, records, result, published_all, drained,
                      workload.recorder.overflowed, time.monotonic() - started_s, error)


PORT_RANGE = (2_000, 11_500)  # node ports and their derived ports (+10000/+20000/+21000) stay below 32768,
# out of the ephemeral range (a client socket there would keep a restarted node from binding its port)
DERIVED_OFFSETS = (0, 10_000, 20_000, 21_000)


def free_base_port(count: int) -> int:
    """A port p such that p+1..p+count, and the management/Raft/metadata ports the nodes derive from them, were free
    a moment ago (good enough for local runs). The search starts at a point derived from the process id."""
    low, high = PORT_RANGE
    span = high - low - count - 1
    start = (os.getpid() * 7919) % span
    for attempt in range(400):
        base = low + (start + attempt * 97) % span
        ports = [base + i + offset for i in range(1, count + 1) for offset in DERIVED_OFFSETS]
        if all(owned(port) and port_free(port) for port in ports):
            return base
    raise RuntimeError("no free port range found")


def port_free(port: int) -> bool:
    """Whether `port` on 127.0.0.1 binds now."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextmanager
def spawned_environment(nodes: int, use_netns: bool = False, toxiproxy_url: str | None = None,
                        data_dir: Path | None = None, clustered: bool | None = None,
                        node_args: tuple[str, ...] = ()) -> Iterator[Environment]:
    """Nodes started here (in namespaces when use_netns), stopped and removed on the way out; they form one cluster
    unless `clustered` is False (default: clustered when more than one node). `node_args`: more `raftmq node`
    options for every node (a scenario's node settings)."""
    with ExitStack() as stack:
        root = data_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="raftmq-chaos-")))
        names = [f"rmq{i}" for i in range(1, nodes + 1)]
        lab = stack.enter_context(NetLab.for_process("rq", names)) if use_netns else None
        base_port = NETNS_PORT if lab else free_base_port(nodes)
        # In namespaces the workload connects from the bridge, not loopback: let guest in from anywhere.
        extra_args = (("--loopback-users", "") if lab else ()) + node_args
        clustered = nodes > 1 if clustered is None else clustered
        cluster = LocalCluster.spawn(root, nodes, base_port, extra_args, netlab=lab, clustered=clustered)
        stack.callback(cluster.stop_all)
        urls = tuple(cluster.url(node) for node in cluster.nodes())
        yield Environment(cluster, urls, lab, toxiproxy_url)


@contextmanager
def fault_proxy_front(env: Environment, nodes: dict[str, tuple[str, int]], seed: int) -> Iterator[Environment]:
    """Our fault proxy in front of every node (proxy "amqp-<node>"); the workload connects through it and toxic
    steps drive its API. Stopped on the way out."""
    with FaultProxyThread(seed=seed) as fault_proxy:
        api = f"http://127.0.0.1:{fault_proxy.api_port}"
        urls = []
        for node, (host, port) in sorted(nodes.items()):
            body = json.dumps({"name": f"amqp-{node}", "listen": "127.0.0.1:0", "upstream": f"{host}:{port}"})
            request = urllib.request.Request(f"{api}/proxies", data=body.encode(), method="POST",
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as response:
                listen = json.loads(response.read())["listen"]
            urls.append(f"amqp://guest:guest@{listen}/%2F")
        yield replace(env, urls=tuple(urls), toxiproxy_url=api)
