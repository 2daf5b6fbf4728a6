"""`MetadataStore.apply` retries with the same command id: a command whose first attempt committed but reported
LEADER_CHANGED (unknown outcome), or whose callback never came, is applied once. pysyncobj is replaced by a fake
replica that runs the real model, so this is deterministic and needs no network."""

from __future__ import annotations

from typing import Any

import cbor2
import pytest
import trio
from pysyncobj import FAIL_REASON

from cluster.metadata import model, store
from cluster.metadata.model import MetadataState, PutVhost
from cluster.metadata.store import MetadataError, MetadataStore, MetadataTimeout
from tests.metadata.helpers import config, free_addresses


class FakeReplica:
    """Applies commands like `_Replica`; `script` says what each attempt reports."""

    def __init__(self, script: list[str]) -> None:
        self.state = MetadataState()
        self.script = script
        self.attempts = 0
        self.cids: list[str] = []

    def read(self) -> tuple[MetadataState, int]:
        return self.state, 0

    def apply_command(self, payload: bytes, callback: Any) -> None:
        step = self.script[min(self.attempts, len(self.script) - 1)]
        self.attempts += 1
        command = model.command_from_dict(cbor2.loads(payload))
        self.cids.append(command.cid)
        if step == "silent":
            return  # pysyncobj lost it: no callback ever
        if step == "denied":
            callback(None, FAIL_REASON.REQUEST_DENIED)
            return
        if step == "fatal":
            callback(None, 99)
            return
        self.state, outcome = model.apply(self.state, command)
        result = cbor2.dumps(model.outcome_to_dict(outcome))
        if step == "commit-but-leader-changed":
            callback(None, FAIL_REASON.LEADER_CHANGED)
        else:
            callback(result, FAIL_REASON.SUCCESS)


def make_store(script: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[MetadataStore, FakeReplica]:
    monkeypatch.setattr(store, "ATTEMPT_TIMEOUT_S", 0.2)
    s = MetadataStore(config(0, free_addresses(1)))
    fake = FakeReplica(script)
    s._replica = fake  # type: ignore[assignment]
    s._syncobj = object()
    monkeypatch.setattr(MetadataStore, "leader", lambda self: "127.0.0.1:1")
    return s, fake


async def test_commit_with_unknown_outcome_is_retried_and_applied_once(monkeypatch: pytest.MonkeyPatch) -> None:
    s, fake = make_store(["commit-but-leader-changed", "denied", "silent", "ok"], monkeypatch)
    out = await s.apply(PutVhost("/"), timeout_s=10)
    assert fake.attempts == 4 and len(set(fake.cids)) == 1  # one command id across every attempt
    assert out.duplicate and out.changes == (
        model.Change("vhost", ("/",), "created"),
        *(model.Change("exchange", ("/", name), "created") for name, _ in model.PREDECLARED_EXCHANGES))
    assert list(fake.state.vhosts) == ["/"]


async def test_a_reason_that_retrying_cannot_fix_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    s, _ = make_store(["fatal"], monkeypatch)
    with pytest.raises(MetadataError, match="reason 99"):
        await s.apply(PutVhost("/"))


async def test_no_outcome_within_the_timeout_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    s, fake = make_store(["silent"], monkeypatch)
    with trio.fail_after(10), pytest.raises(MetadataTimeout, match="may have been applied"):
        await s.apply(PutVhost("/"), timeout_s=1.0)
    assert fake.attempts >= 2
