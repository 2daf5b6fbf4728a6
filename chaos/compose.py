"""Faults against a docker-compose deployment: the `Cluster` and `Partitioner` of `raftmq chaos run --target compose`.

How it works: a compose project's node containers are found by the labels Compose (v1 and v2) puts on every
container (com.docker.compose.project / .service) and by the RAFTMQ_NODE_NAME in their environment; everything
goes through the `docker` CLI on PATH (DOCKER_HOST selects the engine). kill is `docker kill` (SIGKILL), pause and
resume are `docker pause`/`unpause` (the cgroup freezer; a pause the freezer gives up on is tried again), restart
is `docker start` followed by a wait for the container's health check to report healthy. The leader of a queue is
asked of the running, unpaused nodes' management APIs from inside one of their containers (one `docker exec`, by
service name, so no management port needs publishing) and the leader most of them name wins, as for local nodes.
`ComposePartitioner` cuts nodes off with `docker network disconnect` from every network they are on and heals by
connecting them again with the same aliases and address: it can only isolate whole nodes (a node cut off also
loses its clients and HAProxy), so a shape that splits pairs otherwise is refused.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections import Counter
from dataclasses import dataclass

from chaos.scenario import ScenarioError

DOCKER_TIMEOUT_S = 60.0
HEALTHY_TIMEOUT_S = 90.0
PAUSE_ATTEMPTS = 5
MANAGEMENT_PORT = 15672
LEADERS_SCRIPT = (  # standard library only (starts fast): each named node's leader of queue argv[4], or null
    "import base64, json, sys, urllib.request as u\n"
    "port, user, password, queue, hosts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]\n"
    "auth = 'Basic ' + base64.b64encode(f'{user}:{password}'.encode()).decode()\n"
    "def leader(host):\n"
    "    try:\n"
    "        rows = json.load(u.urlopen(u.Request(f'http://{host}:{port}/api/queues',"
    " headers={'Authorization': auth}), timeout=2))\n"
    "    except Exception:\n"
    "        return None\n"
    "    return next((row.get('leader') for row in rows if row.get('name') == queue), None)\n"
    "print(json.dumps({host: leader(host) for host in hosts}))")


def docker(*args: str, timeout_s: float = DOCKER_TIMEOUT_S, check: bool = True,
           env: dict[str, str] | None = None) -> str:
    """Run the docker CLI (`env`: its environment, e.g. DOCKER_HOST); its standard output. A failure raises
    ScenarioError with docker's message."""
    binary = shutil.which("docker")
    if binary is None:
        raise ScenarioError("the compose target needs the docker CLI on PATH")
    done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=timeout_s, env=env)
    if check and done.returncode != 0:
        raise ScenarioError(f"docker {' '.join(args[:2])} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


@dataclass(frozen=True, slots=True)
class Attachment:
    network: str
    aliases: tuple[str, ...]
    address: str


class ComposeCluster:
    """The raftmq nodes of compose project `project`; `url` is where the workload connects (HAProxy)."""

    def __init__(self, project: str, url: str, user: str = "guest", password: str = "guest",
                 env: dict[str, str] | None = None) -> None:
        self.project, self._url, self.user, self.password, self.env = project, url, user, password, env
        self._containers = self._find_nodes()
        self._paused: set[str] = set()
        if not self._containers:
            raise ScenarioError(f"no raftmq node containers in compose project {project!r} "
                                "(docker ps -a --filter label=com.docker.compose.project=...)")

    def _find_nodes(self) -> dict[str, str]:
        ids = self.docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={self.project}").split()
        nodes: dict[str, str] = {}
        for raw in json.loads(self.docker("inspect", *ids)) if ids else []:
            env = dict(item.split("=", 1) for item in raw["Config"]["Env"] if "=" in item)
            if "RAFTMQ_NODE_NAME" in env:
                nodes[env["RAFTMQ_NODE_NAME"]] = raw["Name"].lstrip("/")
        return nodes

    def docker(self, *args: str, timeout_s: float = DOCKER_TIMEOUT_S, check: bool = True) -> str:
        return docker(*args, timeout_s=timeout_s, check=check, env=self.env)

    def container(self, node: str) -> str:
        return self._containers[node]

    def inspect(self, node: str) -> dict[str, object]:
        raw = json.loads(self.docker("inspect", self._containers[node]))[0]
        assert isinstance(raw, dict)
        return raw

    def nodes(self) -> list[str]:
        return sorted(self._containers)

    def pid(self, node: str) -> int | None:
        state = self.inspect(node)["State"]
        assert isinstance(state, dict)
        return int(state["Pid"]) if state.get("Running") and state.get("Pid") else None

    def url(self, node: str) -> str:
        return self._url

    def kill(self, node: str) -> None:
        self.docker("kill", self._containers[node])
        self._paused.discard(node)

    def pause(self, node: str) -> None:
        """`docker pause`, tried again a few times: the freezer gives up ("unable to freeze") when a process of the
        container stays in uninterruptible sleep (an fsync on a busy disk) while it waits."""
        for attempt in range(PAUSE_ATTEMPTS):
            try:
                self.docker("pause", self._containers[node])
                break
            except ScenarioError:
                if attempt == PAUSE_ATTEMPTS - 1:
                    raise
                time.sleep(0.5)
        self._paused.add(node)

    def resume(self, node: str) -> None:
        self.docker("unpause", self._containers[node], check=False)  # already running is fine
        self._paused.discard(node)

    def restart(self, node: str) -> None:
        self.restart_many([node])

    def restart_many(self, nodes: list[str]) -> None:
        """Start the stopped ones (a restart policy may have started them already), then wait until each reports
        healthy: nodes that need each other for a majority come back together."""
        for node in nodes:
            if self.pid(node) is None:
                self.docker("start", self._containers[node])
        self.wait_healthy(nodes)

    def wait_healthy(self, nodes: list[str], timeout_s: float = HEALTHY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        for node in nodes:
            while True:
                state = self.inspect(node)["State"]
                assert isinstance(state, dict)
                health = state.get("Health")
                status = health.get("Status") if isinstance(health, dict) else ("healthy" if state.get("Running")
                                                                                else "stopped")
                if status == "healthy":
                    break
                if time.monotonic() > deadline:
                    raise ScenarioError(f"container of node {node} not healthy within {timeout_s} s ({status}): "
                                        f"docker logs {self._containers[node]}")
                time.sleep(0.5)

    def leader_of(self, queue: str) -> str | None:
        """The leader most running, unpaused nodes name, asked from inside one of them (one `docker exec`) by
        the nodes' service names; None when none names one."""
        live = [node for node in self.nodes() if node not in self._paused and self.pid(node) is not None]
        seen = self.leaders_seen(live, queue)
        votes = Counter(leader for leader in seen.values() if leader in self._containers)
        return votes.most_common(1)[0][0] if votes else None

    def leaders_seen(self, nodes: list[str], queue: str) -> dict[str, str | None]:
        if not nodes:
            return {}
        try:
            out = self.docker("exec", self._containers[nodes[0]], "python3", "-c", LEADERS_SCRIPT, str(MANAGEMENT_PORT),
                         self.user, self.password, queue, *nodes, timeout_s=15.0, check=False)
            seen = json.loads(out) if out.strip() else {}
        except (subprocess.TimeoutExpired, json.JSONDecodeError):
            return {}
        return {str(node): (str(leader) if leader else None) for node, leader in seen.items()}

    def attachments(self, node: str) -> list[Attachment]:
        settings = self.inspect(node)["NetworkSettings"]
        assert isinstance(settings, dict)
        return [Attachment(name, tuple(alias for alias in (net.get("Aliases") or []) if alias),
                           str(net.get("IPAddress") or ""))
                for name, net in sorted(settings["Networks"].items())]


class ComposePartitioner:
    """Partitions of a compose deployment by disconnecting whole nodes from their networks."""

    def __init__(self, cluster: ComposeCluster) -> None:
        self.cluster = cluster
        self._cut: dict[str, list[Attachment]] = {}

    def partition(self, blocked: set[frozenset[str]]) -> None:
        nodes = self.cluster.nodes()
        isolated = [node for node in nodes
                    if all(frozenset((node, other)) in blocked for other in nodes if other != node)]
        covered = {pair for pair in blocked if pair & set(isolated)}
        if not isolated or covered != blocked:
            raise ScenarioError("the compose target can only cut whole nodes off (shape isolate, or halves of 3 "
                                "nodes): docker network disconnect takes a container off its network")
        for node in isolated[: len(nodes) - 1]:
            attachments = self.cluster.attachments(node)
            self._cut[node] = attachments
            for attachment in attachments:
                self.cluster.docker("network", "disconnect", attachment.network, self.cluster.container(node))

    def heal(self) -> None:
        for node, attachments in sorted(self._cut.items()):
            for attachment in attachments:
                self._connect(node, attachment)
        self._cut.clear()

    def _connect(self, node: str, attachment: Attachment) -> None:
        args = [arg for alias in attachment.aliases for arg in ("--alias", alias)]
        container = self.cluster.container(node)
        if attachment.address:  # the same address, so peers find it where they last saw it; refused on a network
            # whose subnet Docker chose itself, then any address (HAProxy re-resolves names: deploy/haproxy.cfg)
            self.cluster.docker("network", "connect", "--ip", attachment.address, *args, attachment.network, container,
                   check=False)
            if self._attached(node, attachment.network):
                return
        self.cluster.docker("network", "connect", *args, attachment.network, container)

    def _attached(self, node: str, network: str) -> bool:
        return any(a.network == network for a in self.cluster.attachments(node))
