"""Runs every script in testdata/ (see interaction.py for the language; RAFT_REWRITE=1 regenerates)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.raft.interaction import run_script

SCRIPTS = sorted((Path(__file__).parent / "testdata").glob("*.txt"))


@pytest.mark.parametrize("path", SCRIPTS, ids=[path.stem for path in SCRIPTS])
def test_script(path: Path) -> None:
    run_script(path)
