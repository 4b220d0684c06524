"""bench/targets.py's gathering of the benches' target lines, without running a bench."""

from __future__ import annotations

import pytest

from bench.targets import main, target_lines


def test_only_the_lines_ending_in_a_verdict_are_gathered() -> None:
    """Lines ending in MET or NOT MET are targets, in order and each once (a summary that
    repeats one adds nothing); figures and headers are not, even when they mention a
    target in passing."""
    out = (
        "== targets ==\n"
        "  one turn (HTTP, sync)  baton  1.90x bare  target <= 1.5x: NOT MET\n"
        "  p95 at 16 clients  0.99x bare  target <= 2.0x: MET  \n"
        "  the target was MET last time, see README\n"
        "  target: worker RSS <= 500 MB: 350 MB MET\n"
        "== summary ==\n"
        "  one turn (HTTP, sync)  baton  1.90x bare  target <= 1.5x: NOT MET\n"
    )
    assert target_lines(out) == [
        "  one turn (HTTP, sync)  baton  1.90x bare  target <= 1.5x: NOT MET",
        "  p95 at 16 clients  0.99x bare  target <= 2.0x: MET",
        "  target: worker RSS <= 500 MB: 350 MB MET",
    ]


def test_an_unknown_bench_is_refused_before_anything_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--only with a name the runner does not have exits 2 naming it, running nothing."""
    with pytest.raises(SystemExit) as exit_:
        main(["--only", "peer,creations"])
    assert exit_.value.code == 2
    assert "creations" in capsys.readouterr().err
