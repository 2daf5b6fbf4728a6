"""The node configuration: precedence flags > env > file > defaults, validation, and the docs table."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.runtime import main as node_main
from node.runtime.config import BootstrapUser, ConfigError, NodeConfig, load, reference_table

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_defaults_match_rabbitmq() -> None:
    config, _ = load([], environ={})
    assert config == NodeConfig()
    assert (config.port, config.listen_address, config.frame_max, config.channel_max) == (5672, "", 131072, 2047)
    assert (config.heartbeat_s, config.max_message_size_bytes) == (60, 128 * 1024 * 1024)
    assert config.resolved_data_dir() == Path("data/raftmq")
    assert config.all_users() == (BootstrapUser("guest", "guest"),)
    assert config.loopback_users == ("guest",)


def test_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('port = 1111\nheartbeat_s = 5\nnode_name = "from-file"\nframe_max = 8192\n')
    env = {"RAFTMQ_PORT": "2222", "RAFTMQ_HEARTBEAT_S": "7", "RAFTMQ_CONFIG_FILE": str(path)}
    config, _ = load(["--port", "3333"], environ=env)
    assert config.port == 3333  # flag
    assert config.heartbeat_s == 7  # env
    assert config.node_name == "from-file"  # file
    assert config.frame_max == 8192
    assert config.channel_max == 2047  # default
    assert config.resolved_data_dir() == Path("data/from-file")


def test_file_users_and_lists(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(
        'loopback_users = ["a", "b"]\ntest_signal_alarms = true\n'
        '[[users]]\nname = "app"\npassword = "pw"\ntags = ["x"]\nvhost = "v"\nconfigure = "^c"\n'
    )
    config, _ = load(["--config", str(path)], environ={"RAFTMQ_MEMORY_HIGH_WATERMARK": "0.5"})
    assert config.loopback_users == ("a", "b")
    assert config.test_signal_alarms is True
    assert config.memory_high_watermark == 0.5
    assert config.extra_users == (BootstrapUser("app", "pw", ("x",), "v", "^c", ".*", ".*"),)
    env_list, _ = load([], environ={"RAFTMQ_LOOPBACK_USERS": "x, y"})
    assert env_list.loopback_users == ("x", "y")


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--port", "70000"], {}, "port"),
        (["--frame-max", "100"], {}, "frame_max"),
        ([], {"RAFTMQ_HEARTBEAT_S": "soon"}, "heartbeat_s"),
        (["--output-buffer-low-bytes", "99999999"], {}, "output_buffer"),
        (["--log-level", "chatty"], {}, "log_level"),
        ([], {"RAFTMQ_TEST_SIGNAL_ALARMS": "perhaps"}, "test_signal_alarms"),
        (["--ssl-port", "5671"], {}, "ssl_port needs ssl_certfile and ssl_keyfile"),
        (["--ssl-verify", "verify_sometimes"], {}, "ssl_verify"),
        (["--ssl-verify", "verify_peer"], {}, "ssl_verify = verify_peer needs ssl_cacertfile"),
        (["--ssl-fail-if-no-peer-cert", "true"], {}, "ssl_fail_if_no_peer_cert needs"),
        (["--ssl-cert-login", "true"], {}, "ssl_cert_login needs"),
        (["--ssl-cert-login-from", "email"], {}, "ssl_cert_login_from"),
        (["--mirror-flush", "sometimes"], {}, "mirror_flush must be fsync|unsynced"),
        ([], {"RAFTMQ_DEFAULT_USER": "raftmq-internal-link"}, "internal logins"),
    ],
)
def test_bad_values_are_refused_naming_the_setting(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(argv, environ=env)


def test_a_reserved_user_name_in_the_config_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "raftmq.toml"
    path.write_text('[[users]]\nname = "raftmq-internal-forward"\npassword = "pw"\n')
    with pytest.raises(ConfigError, match="internal logins"):
        load(["--config", str(path)], environ={})


def test_unknown_file_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text("prot = 1\n")
    with pytest.raises(ConfigError, match="prot"):
        load(["--config", str(path)], environ={})


def test_main_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert node_main.main(["--port", "-1"]) == 2
    assert node_main.main(["--print-config", "--default-pass", "secret"]) == 0
    out = capsys.readouterr().out
    assert "port = 5672" in out
    assert "secret" not in out


def test_unusable_tls_files_are_a_configuration_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "not-a-certificate.pem"
    bad.write_text("hello")
    assert node_main.main(["--ssl-port", "5671", "--ssl-certfile", str(bad), "--ssl-keyfile", str(bad)]) == 2
    assert "ssl_certfile/ssl_keyfile: cannot load" in capsys.readouterr().err


def test_docs_table_is_in_sync() -> None:
    text = (REPO_ROOT / "docs" / "configuration.md").read_text()
    assert reference_table() in text, "regenerate the table in docs/configuration.md from config.reference_table()"
