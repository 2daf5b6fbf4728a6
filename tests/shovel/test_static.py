"""Static shovels (cluster/shovel/static.py): RabbitMQ's `shovels` config section as `[shovels.NAME]` TOML tables.
The translation and its refusals are pure; one real node started with a static shovel in its config file moves
messages from one of its queues to another and lists the shovel as `static`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.shovel.params import ShovelParamError
from cluster.shovel.static import static_definition
from node.runtime.config import ConfigError, values_from_toml
from tests.integration.nodeproc import TEST_CONFIG_TOML, NodeProcess
from tests.shovel.helpers import count, ctl_call, free_port, publish, wait_until

TABLE = {"ack_mode": "on_publish", "reconnect_delay": 5,
         "source": {"uris": ["amqp://a", "amqp://b"], "queue": "q", "prefetch_count": 10},
         "destination": {"uris": ["amqp://c"], "publish_fields": {"exchange": "", "routing_key": "q2"},
                         "add_forward_headers": True, "publish_properties": {"delivery_mode": 2}}}


def test_a_static_shovel_is_the_dynamic_definition_it_means() -> None:
    assert json.loads(static_definition("s", TABLE)) == {
        "ack-mode": "on-publish", "reconnect-delay": 5, "src-uri": ["amqp://a", "amqp://b"], "src-queue": "q",
        "src-prefetch-count": 10, "dest-uri": ["amqp://c"], "dest-exchange": "", "dest-exchange-key": "q2",
        "dest-add-forward-headers": True, "dest-publish-properties": {"delivery_mode": 2}}


@pytest.mark.parametrize(("change", "reason"), [
    ({"ack_mode": "sometimes"}, "ack_mode must be one of"),
    ({"colour": "blue"}, "unknown keys ['colour']"),
    ({"source": {"uris": ["amqp://a"], "queue": "q", "declarations": []}}, "declarations are not supported"),
    ({"source": {"uris": ["amqp://a"]}}, "Must specify 'src-exchange' or 'src-queue'"),
    ({"destination": {"uris": ["amqp://c"], "publish_fields": {"mandatory": True}}}, "publish_fields takes"),
    ({"destination": {"uris": ["amqps://c?verify=maybe"]}}, "verify must be"),
])
def test_invalid_static_shovels_are_refused(change: dict[str, object], reason: str) -> None:
    with pytest.raises(ShovelParamError) as refused:
        static_definition("s", {**TABLE, **change})
    assert reason in str(refused.value) and "static shovel s" in str(refused.value)


def test_the_config_file_refuses_an_invalid_static_shovel(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('[shovels.s]\nack_mode = "on_confirm"\n[shovels.s.source]\nuris = ["amqp://"]\n')
    with pytest.raises(ConfigError, match=r"shovels\.s\.destination"):
        values_from_toml(path)


def test_a_node_runs_the_static_shovel_of_its_config_file(tmp_path: Path) -> None:
    config = ('[shovels.from-config]\nreconnect_delay = 1\n[shovels.from-config.source]\nuris = ["amqp://"]\n'
              'queue = "static-src"\n[shovels.from-config.destination]\nuris = ["amqp://"]\n'
              'queue = "static-dst"\nadd_forward_headers = true\n')
    mport = free_port()
    node = NodeProcess(tmp_path / "node", config_toml=TEST_CONFIG_TOML + config,
                       extra_args=("--management-port", str(mport))).start()
    try:
        publish(node.port, "static-src", 30)
        wait_until(lambda: count(node.port, "static-dst") == 30, 60, "30 messages moved by the static shovel")
        code, rows = ctl_call(mport, "shovel_status")
        assert code == 0 and [(r["name"], r["type"], r["state"]) for r in rows] == [
            ("from-config", "static", "running")]
    finally:
        node.stop()
