"""Rendezvous placement: the same answer everywhere, an even spread, and the
least movement when a node joins or leaves."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from gpufeed.engine._placement import place, rank, score

DIGESTS = [hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(6000)]
NODES = [f"node-{i:02d}" for i in range(10)]


def test_score_is_fixed_bytes_not_per_process():
    # a golden value: BLAKE2b-64 over b"\x00\x00\x00\x01" b"a" b"\x00": any change of the scheme moves data
    assert score("a", b"\x00") == int.from_bytes(hashlib.blake2b(b"\x00\x00\x00\x01a\x00", digest_size=8).digest(),
                                                  "big")
    assert score("ab", b"c") != score("a", b"bc")  # the length prefix keeps the two apart


def test_place_is_a_prefix_of_rank_and_ignores_order_and_duplicates():
    d = DIGESTS[0]
    assert place(d, NODES, 3) == rank(d, NODES)[:3] == place(d, list(reversed(NODES)) + NODES[:2], 3)
    assert sorted(rank(d, NODES)) == NODES
    assert place(d, NODES[:2], 3) == rank(d, NODES[:2])  # fewer live nodes than replicas: all of them
    assert place(d, [], 2) == []
    with pytest.raises(ValueError, match="at least 1 replica"):
        place(d, NODES, 0)


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_spread_is_even(replicas):
    held = Counter(n for d in DIGESTS for n in place(d, NODES, replicas))
    expected = len(DIGESTS) * replicas / len(NODES)
    assert set(held) == set(NODES)
    assert all(abs(c - expected) < 0.12 * expected for c in held.values()), held  # ~5 standard deviations


def test_a_joining_node_takes_only_its_share():
    before = {d: place(d, NODES, 2) for d in DIGESTS}
    after = {d: place(d, [*NODES, "node-new"], 2) for d in DIGESTS}
    moved = [d for d in DIGESTS if set(before[d]) != set(after[d])]
    for d in moved:  # each moved chunk gains the newcomer and loses exactly one old place
        assert "node-new" in after[d] and len(set(before[d]) - set(after[d])) == 1
    share = len(moved) / len(DIGESTS)
    assert abs(share - 2 / 11) < 0.03, share  # 2 of 11 places: the newcomer's share, no more


def test_a_leaving_node_moves_only_what_it_held():
    before = {d: place(d, NODES, 2) for d in DIGESTS}
    rest = [n for n in NODES if n != "node-03"]
    for d in DIGESTS:
        after = place(d, rest, 2)
        if "node-03" in before[d]:
            kept = [n for n in before[d] if n != "node-03"]
            assert after[: len(kept)] == kept or set(kept) <= set(after)
            assert len(set(after) - set(before[d])) == 1  # one new place, the next in rank
        else:
            assert after == before[d]  # untouched
