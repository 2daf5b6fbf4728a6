"""LiveIds (node/runtime/live_ids.py) against a plain set, with hypothesis."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from node.runtime.live_ids import LiveIds

ops = st.lists(st.tuples(st.sampled_from(["add", "discard", "clear"]), st.integers(0, 300)), max_size=200)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_live_ids_behaves_as_a_set(script: list[tuple[str, int]]) -> None:
    live = LiveIds()
    model: set[int] = set()
    for op, msg_id in script:
        if op == "add":
            live.add(msg_id)
            model.add(msg_id)
        elif op == "discard":
            live.discard(msg_id)
            model.discard(msg_id)
        else:
            live.clear()
            model.clear()
        assert len(live) == len(model) and bool(live) == bool(model)
        assert live == model
        assert sorted(live) == sorted(model)
        assert (msg_id in live) == (msg_id in model)


def test_a_dense_run_costs_a_bit_per_id_and_the_front_is_released() -> None:
    live = LiveIds(range(1, 100_001))
    assert len(live) == 100_000 and live.size_bytes <= 12_501
    for msg_id in range(1, 99_001):
        live.discard(msg_id)
    assert len(live) == 1000 and live.size_bytes <= 126
