"""The console script's dispatcher."""

from __future__ import annotations

from node import cli


def test_help_lists_every_subcommand(capsys: object) -> None:
    assert cli.main(["--help"]) == 0


def test_unknown_subcommand_is_refused() -> None:
    assert cli.main(["no-such-command"]) == 2
