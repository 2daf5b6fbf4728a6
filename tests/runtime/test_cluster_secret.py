"""The cluster secret: placeholders and low-entropy secrets are refused at start with a clear error (rules and a
real `raftmq node` process); compose deployments get a random secret of their own instead of a shipped one."""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from deploy import topology as topo
from node.runtime.config import ConfigError, NodeConfig, validate
from node.runtime.secret_strength import secret_weakness
from tests.integration.nodeproc import REPO_ROOT

PLACEHOLDER = "change-me-to-a-long-random-secret"  # what deploy/cluster_secret.example used to ship


@pytest.mark.parametrize("secret, reason", [
    (PLACEHOLDER, "placeholder"),
    ("CHANGEME-0123456789-abcdefghijkl", "placeholder"),
    ("short", "shorter than 16 bytes"),
    ("a" * 64, "distinct characters"),
    ("abcdabcdabcdabcdabcdabcd", "distinct characters"),
    ("correcthorsebatterystaple", "too guessable"),
    ("0123456789abcdef", "too guessable"),  # 16 hex digits: 64 bits
])
def test_weak_secrets_are_refused(secret: str, reason: str) -> None:
    weakness = secret_weakness(secret)
    assert weakness is not None and reason in weakness
    config = NodeConfig(node_name="a", cluster_nodes=("a=127.0.0.1:5000",), cluster_secret=secret)
    with pytest.raises(ConfigError, match="cluster_secret refused"):
        validate(config)


@pytest.mark.parametrize("secret", [secrets.token_hex(16), secrets.token_hex(32), secrets.token_urlsafe(24),
                                    "test-cluster-secret-0123456789"],
                         ids=["token_hex(16)", "token_hex(32)", "token_urlsafe(24)", "fixed"])  # (xdist: stable ids)
def test_random_secrets_pass(secret: str) -> None:
    assert secret_weakness(secret) is None


def test_a_node_with_the_placeholder_secret_exits_at_start_naming_the_problem(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAFTMQ_")}
    env["RAFTMQ_CLUSTER_SECRET"] = PLACEHOLDER
    result = subprocess.run(
        [sys.executable, "-m", "node.cli", "node", "--node-name", "a", "--cluster-nodes", "a=127.0.0.1:5999",
         "--data-dir", str(tmp_path / "a")], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "cluster_secret refused: it is a placeholder" in result.stderr
    assert not (tmp_path / "a").exists()  # refused before anything was written


def test_compose_reads_a_per_deployment_secret_that_new_secret_generates(tmp_path: Path) -> None:
    compose = topo.compose_yaml(topo.load())
    assert "file: ./cluster_secret\n" in compose and "example" not in compose
    assert not (REPO_ROOT / "deploy" / "cluster_secret.example").exists()
    first, second = tmp_path / "one", tmp_path / "two"
    assert topo.new_secret(first) and topo.new_secret(second)
    assert stat.S_IMODE(first.stat().st_mode) == 0o600
    text = first.read_text().strip()
    assert secret_weakness(text) is None and text != second.read_text().strip()
    assert not topo.new_secret(first) and first.read_text().strip() == text  # an existing secret is kept
