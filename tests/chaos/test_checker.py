"""The checker on hand-built histories (one per class) and on hypothesis-generated ones."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.checker import check
from chaos.history import Ack, Delivery, Fault, Publish, Record, acks_of, read_history, split, write_history


def pub(seq: int, outcome: str = "confirmed", publisher: str = "p1", queue: str = "q") -> Publish:
    return Publish(publisher, seq, f"{publisher}-{seq}", queue, outcome, float(seq), float(seq) + 1)  # type: ignore[arg-type]


def dlv(payload_id: str, consumer: str = "c1", redelivered: bool = False, queue: str = "q") -> Delivery:
    return Delivery(payload_id, consumer, queue, redelivered, 100.0)


def test_everything_confirmed_and_delivered_once_is_ok() -> None:
    result = check([pub(1), pub(2)], [dlv("p1-1"), dlv("p1-2")])
    assert result.valid and result.ok == 2 and result.confirmed == 2
    assert not (result.lost or result.unexpected or result.recovered or result.duplicated or result.order_violations)


def test_confirmed_but_never_delivered_is_lost() -> None:
    result = check([pub(1), pub(2)], [dlv("p1-1")])
    assert result.lost == ("p1-2",) and not result.valid


def test_delivered_but_never_published_is_unexpected() -> None:
    result = check([pub(1)], [dlv("p1-1"), dlv("ghost-7")])
    assert result.unexpected == ("ghost-7",) and not result.valid


def test_unconfirmed_but_delivered_is_recovered_and_allowed() -> None:
    result = check([pub(1, "unknown"), pub(2, "nacked"), pub(3, "unknown")], [dlv("p1-1"), dlv("p1-2")])
    assert result.recovered == ("p1-1", "p1-2") and result.unconfirmed_absent == ("p1-3",)
    assert result.valid and result.unknown == 2 and result.nacked == 1


def test_delivered_twice_is_duplicated_and_allowed_when_flagged_redelivered() -> None:
    result = check([pub(1)], [dlv("p1-1"), dlv("p1-1", "c2", redelivered=True), dlv("p1-1", redelivered=True)])
    assert result.duplicated == (("p1-1", 3),) and result.valid
    assert result.summary()["duplicate_deliveries"] == 2


def test_a_repeat_delivery_not_flagged_redelivered_is_a_violation() -> None:
    result = check([pub(1), pub(2)], [dlv("p1-1"), dlv("p1-2"), dlv("p1-1", "c2")])
    assert result.unflagged_redeliveries == (("p1-1", "c2"),) and not result.valid
    assert result.summary()["unflagged_redeliveries"] == 1


def at(payload_id: str, ms: float, consumer: str = "c1", redelivered: bool = True) -> Delivery:
    return Delivery(payload_id, consumer, "q", redelivered, ms)


def test_redelivery_after_an_ack_is_counted_and_after_a_settled_ack_is_a_violation() -> None:
    publishes = [pub(1), pub(2)]
    deliveries = [at("p1-1", 10, redelivered=False), at("p1-2", 11, redelivered=False),
                  at("p1-1", 20, "c2"), at("p1-2", 60, "drain")]
    acks = [Ack("p1-1", "c1", "q", 12), Ack("p1-2", "c1", "q", 13)]
    closed_between = [Fault("closed", "c1", 50.0)]
    result = check(publishes, deliveries, acks, closed_between)
    assert result.redelivered_after_ack == ("p1-1", "p1-2")
    assert result.redelivered_after_settled_ack == ("p1-2",) and not result.valid
    # The same history without the clean close: the acks may have been lost with a connection; allowed.
    lenient = check(publishes, deliveries, acks, [Fault("closed", "c2", 50.0)])
    assert lenient.redelivered_after_ack == ("p1-1", "p1-2") and lenient.valid
    # A close before the ack does not settle it.
    assert check(publishes, deliveries, acks, [Fault("closed", "c1", 5.0)]).valid


def test_first_deliveries_out_of_publisher_order_are_violations() -> None:
    result = check([pub(1), pub(2), pub(3)], [dlv("p1-2"), dlv("p1-1"), dlv("p1-3")])
    assert len(result.order_violations) == 1
    violation = result.order_violations[0]
    assert (violation.previous_sequence, violation.sequence, violation.payload_id) == (2, 1, "p1-1")


def test_redeliveries_and_separate_consumers_and_publishers_do_not_break_order() -> None:
    publishes = [pub(1), pub(2), pub(1, publisher="p2"), pub(3)]
    deliveries = [dlv("p1-2", "c1"), dlv("p1-1", "c2"), dlv("p2-1", "c1"), dlv("p1-1", "c1", redelivered=True),
                  dlv("p1-3", "c1")]
    assert check(publishes, deliveries).order_violations == ()


def test_strongest_outcome_wins_for_a_repeated_payload() -> None:
    result = check([pub(1, "unknown"), pub(1, "confirmed")], [])
    assert result.lost == ("p1-1",) and result.attempted == 1


def test_history_round_trips_through_json_lines(tmp_path: Path) -> None:
    records: list[Record] = [pub(1), dlv("p1-1", redelivered=True), Ack("p1-1", "c1", "q", 101.0), Fault("kill", "rmq1", 12.5, "SIGKILL"),
               pub(2, "unknown")]
    path = tmp_path / "history.jsonl"
    write_history(path, records)
    assert list(read_history(path)) == records
    publishes, deliveries, faults = split(read_history(path))
    assert (len(publishes), len(deliveries), len(faults)) == (2, 1, 1)
    assert acks_of(read_history(path)) == [Ack("p1-1", "c1", "q", 101.0)]


# --- hypothesis: the classes partition the published ids and agree with a naive recount ---------------------

outcomes = st.sampled_from(["confirmed", "nacked", "unknown"])
histories = st.tuples(
    st.lists(outcomes, max_size=30),
    st.lists(st.tuples(st.integers(0, 40), st.booleans(), st.sampled_from(["c1", "c2"])), max_size=60),
)


@settings(max_examples=120, deadline=None)
@given(histories)
def test_classes_partition_every_payload(history: tuple[list[str], list[tuple[int, bool, str]]]) -> None:
    outcome_list, delivery_list = history
    publishes = [pub(seq, outcome) for seq, outcome in enumerate(outcome_list)]
    deliveries = [dlv(f"p1-{seq}", consumer, redelivered) for seq, redelivered, consumer in delivery_list]
    result = check(publishes, deliveries)
    published_ids = {p.payload_id for p in publishes}
    delivered_ids = {d.payload_id for d in deliveries}
    confirmed_ids = {p.payload_id for p in publishes if p.outcome == "confirmed"}
    assert set(result.lost) == confirmed_ids - delivered_ids
    assert set(result.unexpected) == delivered_ids - published_ids
    assert set(result.recovered) == (published_ids - confirmed_ids) & delivered_ids
    assert result.ok + len(result.lost) + len(result.recovered) + len(result.unconfirmed_absent) == len(published_ids)
    assert result.valid == (not result.lost and not result.unexpected and not result.unflagged_redeliveries)
    seen: set[str] = set()
    for delivery in deliveries:
        assert ((delivery.payload_id, delivery.consumer) in result.unflagged_redeliveries or delivery.redelivered
                or delivery.payload_id not in seen)
        seen.add(delivery.payload_id)
    assert sum(count for _, count in result.duplicated) - len(result.duplicated) == len(deliveries) - len(delivered_ids)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 20), unique=True, max_size=20))
def test_in_order_first_deliveries_never_violate(sequences: list[int]) -> None:
    publishes = [pub(seq) for seq in sequences]
    consumers = ["c1", "c2", "c3"]
    deliveries = [dlv(f"p1-{seq}", consumers[seq % 3]) for seq in sorted(sequences)]
    assert check(publishes, deliveries).order_violations == ()
    if len(sequences) >= 2:
        backwards = [dlv(f"p1-{seq}") for seq in sorted(sequences, reverse=True)]
        assert len(check(publishes, backwards).order_violations) == len(sequences) - 1


# --- connections: a clean close settles only the acks sent on the connection it closed ----------------------


def test_a_clean_close_after_a_lost_connection_settles_no_ack_of_the_lost_one() -> None:
    publishes = [pub(1), pub(2)]
    deliveries = [at("p1-1", 10, redelivered=False), at("p1-2", 25, redelivered=False),
                  at("p1-1", 60, "drain"), at("p1-2", 61, "drain")]
    acks = [Ack("p1-1", "c1", "q", 12), Ack("p1-2", "c1", "q", 26)]
    # c1's first connection died (with its node) after the ack of p1-1; it reconnected, acked p1-2, closed cleanly.
    faults = [Fault("connection-lost", "c1", 20.0), Fault("closed", "c1", 50.0)]
    result = check(publishes, deliveries, acks, faults)
    assert result.redelivered_after_ack == ("p1-1", "p1-2")
    assert result.redelivered_after_settled_ack == ("p1-2",) and not result.valid
    # Without the marker (older histories) the close counts for both acks.
    assert check(publishes, deliveries, acks, faults[1:]).redelivered_after_settled_ack == ("p1-1", "p1-2")
    # Another consumer's lost connection changes nothing for c1.
    other = [Fault("connection-lost", "c2", 20.0), Fault("closed", "c1", 50.0)]
    assert check(publishes, deliveries, acks, other).redelivered_after_settled_ack == ("p1-1", "p1-2")


def test_a_connection_lost_at_the_ack_time_leaves_the_ack_unsettled() -> None:
    deliveries = [at("p1-1", 10, redelivered=False), at("p1-1", 60, "drain")]
    acks = [Ack("p1-1", "c1", "q", 12)]
    faults = [Fault("connection-lost", "c1", 12.0), Fault("closed", "c1", 12.0)]
    result = check([pub(1)], deliveries, acks, faults)
    assert result.redelivered_after_ack == ("p1-1",) and result.valid


def test_an_ack_settled_before_a_later_connection_loss_stays_settled() -> None:
    deliveries = [at("p1-1", 10, redelivered=False), at("p1-1", 90, "drain")]
    acks = [Ack("p1-1", "c1", "q", 12)]
    faults = [Fault("closed", "c1", 30.0), Fault("connection-lost", "c1", 70.0), Fault("closed", "c1", 80.0)]
    assert check([pub(1)], deliveries, acks, faults).redelivered_after_settled_ack == ("p1-1",)


ack_histories = st.lists(st.tuples(st.sampled_from(["ack", "closed", "connection-lost", "deliver"]),
                                   st.integers(0, 4), st.sampled_from(["c1", "c2"])), max_size=40)


@settings(max_examples=150, deadline=None)
@given(ack_histories)
def test_connection_lost_markers_only_ever_excuse(events: list[tuple[str, int, str]]) -> None:
    """Dropping every "connection-lost" marker can only add settled acks, never remove any (and they never change
    what counts as redelivered after an ack)."""
    acks, deliveries, faults = [], [], []
    for time_ms, (kind, seq, consumer) in enumerate(events):
        if kind == "ack":
            acks.append(Ack(f"p1-{seq}", consumer, "q", float(time_ms)))
        elif kind == "deliver":
            deliveries.append(at(f"p1-{seq}", float(time_ms), consumer))
        else:
            faults.append(Fault(kind, consumer, float(time_ms)))
    publishes = [pub(seq) for seq in range(5)]
    with_markers = check(publishes, deliveries, acks, faults)
    without = check(publishes, deliveries, acks, [f for f in faults if f.kind != "connection-lost"])
    assert set(with_markers.redelivered_after_settled_ack) <= set(without.redelivered_after_settled_ack)
    assert with_markers.redelivered_after_ack == without.redelivered_after_ack
