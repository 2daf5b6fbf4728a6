"""format.encode_wal_frames: the same bytes as one encode_wal_frame per op, joined."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.log import format as fmt

ops = st.lists(st.tuples(st.sampled_from(list(fmt.WalKind)), st.sampled_from(["a", "queue:/:q", "é"]),
                         st.integers(0, 2**62), st.integers(0, 2**62), st.binary(max_size=64), st.integers(0, 99)),
               max_size=20)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_batch_matches_frame_by_frame(batch: list[tuple[fmt.WalKind, str, int, int, bytes, int]]) -> None:
    expected = b"".join(fmt.encode_wal_frame(kind, stream, offset, ts, payload)
                        for kind, stream, offset, ts, payload, _ in batch)
    assert fmt.encode_wal_frames(batch) == expected


def test_batch_refuses_a_long_stream_name() -> None:
    with pytest.raises(ValueError):
        fmt.encode_wal_frames([(fmt.WalKind.APPEND, "x" * (fmt.STREAM_NAME_BYTES_MAX + 1), 0, 0, b"", 1)])
