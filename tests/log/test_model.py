"""Stateful property test: NodeLog against a tiny in-memory reference model.

Random sequences of append / commit / truncate_after / write_snapshot / delete_stream / clean reopen / crash right
after a commit, with small segment, index and WAL sizes so rolls and checkpoints happen often.  After every step,
every stream reads back exactly what the model says.
"""

from __future__ import annotations

import pathlib
import shutil
import tempfile
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from cluster.log import LogConfig, NodeLog

CONFIG = LogConfig(segment_size_bytes_max=600, index_interval_bytes=100, wal_size_bytes_max=3000,
                   append_buffer_bytes_max=1500)
STREAMS = st.sampled_from(["a", "b", "c"])


@dataclass
class ModelStream:
    records: dict[int, bytes] = field(default_factory=dict)
    snapshot: tuple[int, bytes] | None = None
    next_offset: int = 0

    @property
    def snapshot_offset(self) -> int:
        return self.snapshot[0] if self.snapshot else -1


class NodeLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = pathlib.Path(tempfile.mkdtemp(prefix="log-model-"))
        self.log = NodeLog.open(self.directory, CONFIG)
        self.model: dict[str, ModelStream] = {}

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def stream(self, name: str) -> ModelStream:
        return self.model.setdefault(name, ModelStream())

    @rule(name=STREAMS, size=st.integers(0, 250), fill=st.integers(0, 255))
    def append(self, name: str, size: int, fill: int) -> None:
        model = self.stream(name)
        payload = bytes([fill]) * size
        assert self.log.append(name, payload, timestamp_ms=model.next_offset) == model.next_offset
        model.records[model.next_offset] = payload
        model.next_offset += 1

    @rule()
    def commit(self) -> None:
        self.log.commit()

    @rule(name=STREAMS, back=st.integers(0, 20))
    def truncate_after(self, name: str, back: int) -> None:
        model = self.stream(name)
        offset = max(model.snapshot_offset, model.next_offset - 1 - back)
        if offset < 0:
            return
        self.log.truncate_after(name, offset)
        model.records = {o: p for o, p in model.records.items() if o <= offset}
        model.next_offset = min(model.next_offset, offset + 1)

    @rule(name=STREAMS, back=st.integers(0, 20), ahead=st.booleans())
    def write_snapshot(self, name: str, back: int, ahead: bool) -> None:
        model = self.stream(name)
        offset = model.next_offset + 3 if ahead else model.next_offset - 1 - back  # ahead: a leader's snapshot
        if offset < max(0, model.snapshot_offset):
            return
        state = f"state-{offset}".encode()
        self.log.write_snapshot(name, offset, state)
        model.snapshot = (offset, state)
        model.next_offset = max(model.next_offset, offset + 1)

    @rule(name=STREAMS)
    def delete_stream(self, name: str) -> None:
        self.log.delete_stream(name)
        self.model.pop(name, None)

    @rule()
    def reopen_cleanly(self) -> None:
        self.log.close()
        self.log = NodeLog.open(self.directory, CONFIG)

    @rule()
    def crash_after_commit(self) -> None:
        self.log.commit()
        self.log._handles.close_all()  # only release descriptors: no checkpoint, like a kill -9
        self.log = NodeLog.open(self.directory, CONFIG)

    @invariant()
    def reads_match_the_model(self) -> None:
        for name in ("a", "b", "c"):
            model = self.model.get(name)
            state, iterator = self.log.read(name)
            if model is None:
                assert (state, list(iterator)) == (None, [])
                continue
            expected = sorted((o, p) for o, p in model.records.items() if o > model.snapshot_offset)
            assert state == (model.snapshot[1] if model.snapshot else None)
            assert list(iterator) == expected
            assert self.log.end_offset(name) == model.next_offset
            if expected:
                offset, payload = expected[len(expected) // 2]
                assert self.log.read_at(name, offset) == payload


NodeLogMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=40, deadline=None,
                                            suppress_health_check=[HealthCheck.too_slow])
test_node_log_matches_model = NodeLogMachine.TestCase
