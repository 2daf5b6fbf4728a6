"""The pysyncobj journal is fsynced on every mutation, and a store's state comes back from its data dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cluster.metadata import durable
from cluster.metadata.durable import DurableFileJournal
from cluster.metadata.model import DeclareQueue, PutVhost, QueueRecord
from cluster.metadata.store import MetadataStore
from tests.metadata.helpers import config, free_addresses, wait_until


def test_journal_fsyncs_every_append_truncation_and_vote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    path = str(tmp_path / "j")
    journal = DurableFileJournal(path)
    synced.clear()
    journal.add(b"a", 1, 1)
    journal.add(b"b", 2, 1)
    assert len(synced) == 2
    journal.deleteEntriesFrom(1)
    assert len(synced) == 3
    journal.setCurrentTerm(7, "127.0.0.1:1")
    assert len(synced) == 5  # the meta file and its directory
    journal._destroy()
    reopened = DurableFileJournal(path)
    assert len(reopened) == 1 and reopened[0] == (b"a", 1, 1)
    assert reopened.getCurrentTerm() == 7 and reopened.getVotedForNodeId() == "127.0.0.1:1"
    reopened._destroy()


async def test_a_restarted_store_replays_its_journal(tmp_path: Path) -> None:
    addr = free_addresses(1)
    store = MetadataStore(config(0, addr, data_dir=tmp_path))
    await store.start()
    try:
        assert (await store.apply(PutVhost("/"))).ok
        q = QueueRecord("/", "q", "quorum", leader="n0", members=("n0",))
        assert (await store.apply(DeclareQueue(q, cid="dq"))).ok
        before = store.state.definitions()
    finally:
        store.close()
    assert durable.FSYNC_COUNTER["journal"] > 0
    await wait_until(lambda: _port_free(addr[0]), what="the old store's port to close")
    again = MetadataStore(config(0, addr, data_dir=tmp_path))
    await again.start()
    try:
        assert again.state.definitions() == before
        assert (await again.apply(DeclareQueue(q, cid="dq"))).duplicate
    finally:
        again.close()


def _port_free(address: str) -> bool:
    import socket

    host, port = address.split(":")
    with socket.socket() as s:
        try:
            s.bind((host, int(port)))
        except OSError:
            return False
    return True
