"""bench/peer.py's phase selection and target lines, without running a stack."""

from __future__ import annotations

import pytest

from bench.peer import PHASES, phases_of, turn_targets

SEQ = {"bare": [0.05, 0.05], "peer": [0.1, 0.1], "baton": [0.07, 0.07]}
TPS = {"bare": [10.0], "peer": [6.0], "baton": [9.0]}


def test_phases_run_in_their_order_and_turns_only_is_an_alias() -> None:
    """--phases keeps the bench's order whatever the order given; --turns-only is turns."""
    assert phases_of("sse,review", turns_only=False) == ["review", "sse"]
    assert phases_of(",".join(PHASES), turns_only=False) == list(PHASES)
    assert phases_of("review", turns_only=True) == ["turns"]


def test_an_unknown_phase_is_refused() -> None:
    """A phase name the bench does not have is an error naming it."""
    with pytest.raises(ValueError, match="reviews"):
        phases_of("turns,reviews", turns_only=False)


def test_the_target_lines_without_the_peer_say_n_a() -> None:
    """--systems bare,baton: the peer's ratios print n/a (it used to be a KeyError) and
    only the ratio to bare is judged."""
    seq = {k: v for k, v in SEQ.items() if k != "peer"}
    tps = {k: v for k, v in TPS.items() if k != "peer"}
    turn, throughput = turn_targets(seq, tps, 20)
    assert "peer   n/a" in turn and "1.40x bare" in turn and turn.endswith(": MET")
    assert "peer   n/a" in throughput and "0.90x bare" in throughput
    assert throughput.endswith(": MET")


def test_the_target_lines_with_the_peer_compare_against_it() -> None:
    """With the peer run, each line gives its ratio and judges Baton against it too."""
    turn, throughput = turn_targets(SEQ, TPS, 20)
    assert "peer  2.00x" in turn and turn.endswith(": MET")
    assert "peer  0.60x" in throughput and throughput.endswith(": MET")
    slower = {**SEQ, "peer": [0.06]}
    assert turn_targets(slower, TPS, 20)[0].endswith(": NOT MET")


def test_baton_must_be_below_each_view_of_the_peer() -> None:
    """With the peer behind an API run too, both peer ratios print and Baton must beat
    each: faster than the bare peer but slower than the peer behind its API is NOT MET."""
    seq = {**SEQ, "peer-api": [0.12]}
    tps = {**TPS, "peer-api": [5.0]}
    turn, throughput = turn_targets(seq, tps, 20)
    assert "peer  2.00x" in turn and "peer-api  2.40x" in turn and turn.endswith(": MET")
    assert "peer-api  0.50x" in throughput and throughput.endswith(": MET")
    behind_api = {**seq, "peer-api": [0.065]}
    assert turn_targets(behind_api, tps, 20)[0].endswith(": NOT MET")
    assert turn_targets(seq, {**tps, "peer-api": [9.5]}, 20)[1].endswith(": NOT MET")


def test_no_target_lines_without_baton() -> None:
    """bare and the peer alone (a profiling run) judge no Baton target."""
    assert turn_targets({"bare": [0.05]}, {"bare": [10.0]}, 20) == []
