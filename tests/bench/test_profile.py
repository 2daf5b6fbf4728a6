"""`raftmq bench profile`'s py-spy raw-format aggregation (pure): self and inclusive counts and shares."""

from __future__ import annotations

from bench.profile import aggregate_raw, format_profile, top_functions

RAW = """\
<module> (node/cli.py);run (trio/_core/_run.py);handle (node/broker/broker.py);encode (cbor2) 6
<module> (node/cli.py);run (trio/_core/_run.py);get_events (trio/_core/_io_epoll.py) 3
_bootstrap (threading.py);_work (trio/_core/_thread_cache.py);sync (cluster/log/wal.py) 1
<module> (node/cli.py);f (x.py);g (x.py);f (x.py) 2
not a sample line
"""


def test_aggregate_counts_self_and_inclusive_samples() -> None:
    profile = aggregate_raw(RAW)
    assert profile.samples == 12
    assert profile.self_counts["encode (cbor2)"] == 6
    assert profile.inclusive_counts["run (trio/_core/_run.py)"] == 9
    assert profile.inclusive_counts["f (x.py)"] == 2  # recursion counts once per stack
    assert profile.self_counts["f (x.py)"] == 2


def test_top_functions_gives_percentages_of_all_samples() -> None:
    profile = aggregate_raw(RAW)
    assert top_functions(profile, 1) == [("encode (cbor2)", 50.0)]
    top = dict(top_functions(profile, 3, inclusive=True))
    assert top["run (trio/_core/_run.py)"] == 75.0
    assert top_functions(aggregate_raw(""), 5) == []


def test_format_profile_leaves_out_the_roots_every_sample_shares() -> None:
    only_main = "\n".join(line for line in RAW.splitlines() if line.startswith("<module>"))
    text = format_profile("rmq1", "leader", aggregate_raw(only_main), 5)
    assert "rmq1 (leader): 11 samples" in text
    assert "<module> (node/cli.py)" not in text.split("inclusive")[1]
