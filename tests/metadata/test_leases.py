"""The ownership lease rules (cluster/metadata/leases.py) through the metadata model: claims are a compare-and-set
on the generation, a lease held elsewhere is taken only once its holder's node lease ended `margin_ms` before the
claimer's clock, renewals never shorten, releases free a lease, and none of it produces a Change (nothing mirrors
it). Pure: times are plain numbers."""

from __future__ import annotations

import cbor2

from cluster.metadata import model as md
from cluster.metadata.leases import ClaimLease, LeaseRecord, NodeLeaseRecord, ReleaseLease, RenewNodeLease

KEY = ("shovel", "/", "s1")
LEASE, MARGIN = 10_000, 1_500


def claim(node: str, generation: int, now_ms: int) -> ClaimLease:
    return ClaimLease(*KEY, node=node, generation=generation, now_ms=now_ms, lease_ms=LEASE, margin_ms=MARGIN)


def run(*commands: object) -> tuple[md.MetadataState, list[md.Outcome]]:
    state, outcomes = md.MetadataState(), []
    for command in commands:
        state, outcome = md.apply(state, command)  # type: ignore[arg-type]
        outcomes.append(outcome)
    return state, outcomes


def test_a_free_lease_is_claimed_and_renews_the_claimers_node_lease() -> None:
    state, [out] = run(claim("a", 1, 1000))
    assert out.ok and out.changes == ()
    assert state.leases[KEY] == LeaseRecord(*KEY, holder="a", generation=1)
    assert state.node_leases["a"] == NodeLeaseRecord("a", 1000 + LEASE)


def test_a_held_lease_is_taken_only_after_expiry_plus_margin() -> None:
    expiry = 1000 + LEASE
    _, outs = run(claim("a", 1, 1000), claim("b", 2, expiry), claim("b", 2, expiry + MARGIN - 1))
    assert [o.ok for o in outs] == [True, False, False]
    assert "held by a" in outs[1].refused
    state, outs = run(claim("a", 1, 1000), claim("b", 2, expiry + MARGIN))
    assert outs[1].ok and state.leases[KEY].holder == "b" and state.leases[KEY].generation == 2


def test_a_renewal_keeps_the_lease_from_being_taken() -> None:
    state, outs = run(claim("a", 1, 1000), RenewNodeLease("a", 5000, LEASE), claim("b", 2, 1000 + LEASE + MARGIN))
    assert [o.ok for o in outs] == [True, True, False] and outs[1].changes == ()
    assert state.node_leases["a"].expires_ms == 5000 + LEASE
    # a renewal committed late, sent before the last one, never shortens the lease
    state, _ = md.apply(state, RenewNodeLease("a", 2000, LEASE))
    assert state.node_leases["a"].expires_ms == 5000 + LEASE


def test_claims_are_a_compare_and_set_on_the_generation() -> None:
    # two nodes that both saw generation 1 expire: only the first claim of generation 2 wins
    late = 1000 + LEASE + MARGIN
    state, outs = run(claim("a", 1, 1000), claim("b", 2, late), claim("c", 2, late + 10_000))
    assert [o.ok for o in outs] == [True, True, False]
    assert "generation 2, not 1" in outs[2].refused
    assert state.leases[KEY].holder == "b"


def test_the_holder_reclaims_its_own_lease_at_once_with_a_new_generation() -> None:
    # a restarted node takes its lease back from its earlier process: the old process's generation is dead
    state, outs = run(claim("a", 1, 1000), claim("a", 2, 1500))
    assert all(o.ok for o in outs) and state.leases[KEY].generation == 2


def test_release_frees_the_lease_only_for_its_holder_and_generation() -> None:
    state, outs = run(claim("a", 1, 1000), ReleaseLease(*KEY, node="b", generation=1),
                      ReleaseLease(*KEY, node="a", generation=0), ReleaseLease(*KEY, node="a", generation=1),
                      claim("b", 2, 1001))  # free again: taken at once, long before a's node lease ends
    assert [o.ok for o in outs] == [True, False, False, True, True]
    assert state.leases[KEY] == LeaseRecord(*KEY, holder="b", generation=2)


def test_a_holder_without_a_node_lease_record_counts_as_expired() -> None:
    state = md.MetadataState(leases={KEY: LeaseRecord(*KEY, holder="gone", generation=3)})
    state, outcome = md.apply(state, claim("b", 4, 0))
    assert outcome.ok and state.leases[KEY].holder == "b"


def test_leases_survive_a_snapshot_and_the_command_codec() -> None:
    state, _ = run(claim("a", 1, 1000), RenewNodeLease("a", 3000, LEASE))
    data = cbor2.loads(cbor2.dumps(md.snapshot(state)))
    assert md.restore(data) == state
    for command in (claim("a", 1, 1000), RenewNodeLease("a", 3000, LEASE), ReleaseLease(*KEY, node="a",
                                                                                      generation=1)):
        assert md.command_from_dict(cbor2.loads(cbor2.dumps(md.command_to_dict(command)))) == command
    # a snapshot written before leases existed restores with none
    old = md.snapshot(md.MetadataState())
    del old["leases"], old["node_leases"]
    assert md.restore(old).leases == {}
