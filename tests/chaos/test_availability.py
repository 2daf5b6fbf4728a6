"""Unavailability windows from hand-built histories: the longest gap between confirms, time to a confirm after a
fault."""

from __future__ import annotations

from chaos.availability import availability, longest_gap
from chaos.history import Fault, Publish


def confirmed(seq: int, sent_ms: float, settled_ms: float) -> Publish:
    return Publish("p1", seq, f"p1-{seq}", "q", "confirmed", sent_ms, settled_ms)


def test_longest_gap_and_where_it_starts() -> None:
    assert longest_gap([]) == (0.0, None) and longest_gap([5.0]) == (0.0, None)
    assert longest_gap([0.0, 10.0, 15.0, 40.0, 41.0]) == (25.0, 15.0)


def test_first_confirm_after_a_fault_counts_only_publishes_sent_after_it() -> None:
    publishes = [confirmed(0, 0, 5), confirmed(1, 90, 400),  # sent before the fault, settled late
                 confirmed(2, 401, 700), Publish("p1", 3, "p1-3", "q", "unknown", 702, None)]
    faults = [Fault("purge", "q", 0.0), Fault("kill", "rmq1", 100.0, "leader-of-queue"), Fault("up", "rmq1", 300.0),
              Fault("pause", "rmq2", 800.0)]
    found = availability(publishes, faults)
    assert found.confirm_gap_ms_max == 395.0 and found.confirm_gap_start_ms == 5.0
    assert found.confirm_latency_ms_max == 310.0
    assert [(f.kind, f.first_confirm_after_ms) for f in found.faults] == [("kill", 600.0), ("pause", None)]
    assert found.as_dict()["faults"][0] == {"kind": "kill", "target": "rmq1", "at_ms": 100.0,
                                            "first_confirm_after_ms": 600.0, "sent_after": True}
    assert [f.sent_after for f in found.faults] == [True, False]  # nothing was published after the pause
