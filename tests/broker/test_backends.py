"""Queue backends (node/broker/backend.py): each queue gets its backend once, at declare, mirror or recovery, and
the handler modules never look at the node's mode themselves."""

from __future__ import annotations

import ast
from pathlib import Path

from node.amqp import methods as m
from node.broker.backend_local import LocalBackend
from node.broker.backend_replicated import ReplicatedBackend
from node.broker.records import QueueRecord
from node.broker.replica_machine import ProposingMachine
from tests.broker.cluster_harness import Cluster, cluster_client, take
from tests.broker.harness import connected, methods, new_broker

BROKER_DIR = Path(__file__).resolve().parents[2] / "node" / "broker"


def test_a_single_node_gives_every_queue_a_local_backend_and_recovery_does_too() -> None:
    client = connected()
    client.declare("durable-q", durable=True)
    client.declare("excl-q", exclusive=True)
    queues = client.broker.vhosts["/"].queues
    assert all(type(q.backend) is LocalBackend for q in queues.values())
    assert queues["durable-q"].backend is queues["excl-q"].backend  # one backend object, shared
    assert client.broker.backends[0] is queues["durable-q"].backend  # (then the mirrored backend: ha-* policies)

    recovered = new_broker()
    recovered.recover([QueueRecord("/", "durable-q", False, {})])
    assert type(recovered.vhosts["/"].queues["durable-q"].backend) is LocalBackend


def test_a_cluster_node_gives_every_queue_a_raft_backend_mirrored_ones_too() -> None:
    cluster = Cluster()
    a = cluster_client(cluster, "a")
    a.declare("q", durable=True, arguments={"x-queue-type": "quorum"})
    a.declare("classic", durable=True)
    cluster.commit()
    for node in ("a", "b", "c"):
        take(cluster, node)
        queues = cluster.brokers[node].vhosts["/"].queues
        assert {name: type(q.backend) for name, q in queues.items()} == {"q": ReplicatedBackend, "classic": ReplicatedBackend}


def test_declare_ok_counts_consumers_through_the_backend() -> None:
    client = connected()
    client.declare("q")
    client.consume("q", "c1")
    ok = [x for x in methods(client.declare("q")) if isinstance(x, m.QueueDeclareOk)]
    assert ok[0].consumer_count == 1


def test_only_the_facade_reads_the_nodes_mode() -> None:
    """`BrokerConfig.replicated` is read in one place, `Broker._choose_backends`; handlers ask the queue's backend."""
    readers: list[str] = []
    for path in sorted(BROKER_DIR.glob("*.py")):
        source = path.read_text()
        if ".replicated" not in source:  # (parse only the candidates: cheap)
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Attribute) and node.attr == "replicated":
                readers.append(f"{path.name}:{node.lineno}")
    assert readers == [f"broker.py:{_choose_line()}"]


def _choose_line() -> int:
    tree = ast.parse((BROKER_DIR / "broker.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "_choose_backends":
            attrs = [n for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr == "replicated"]
            assert len(attrs) == 1
            return attrs[0].lineno
    raise AssertionError("Broker._choose_backends not found")


def test_handlers_ask_the_backend_not_its_name() -> None:
    """What differs between backends is asked of `QueueBackend` (e.g. `publish_path`); `name` is a label only, and
    the queue machine's stand-in answers the reads it is asked explicitly (no catch-all `__getattr__`)."""
    readers: list[str] = []
    for path in sorted([*BROKER_DIR.glob("*.py"), *(BROKER_DIR.parent / "runtime").rglob("*.py")]):
        source = path.read_text()
        if "backend" not in source:
            continue
        for node in ast.walk(ast.parse(source)):
            name_of_backend = (isinstance(node, ast.Attribute) and node.attr == "name"
                               and isinstance(node.value, ast.Attribute) and node.value.attr == "backend")
            getattr_name = (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                            and node.func.id == "getattr" and len(node.args) >= 2
                            and isinstance(node.args[1], ast.Constant) and node.args[1].value == "name"
                            and "backend" in ast.unparse(node.args[0]))
            if name_of_backend or getattr_name:
                readers.append(f"{path.name}:{node.lineno}")
    assert readers == []
    assert "__getattr__" not in vars(ProposingMachine)
