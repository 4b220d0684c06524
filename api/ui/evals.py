"""The console's eval page (docs/change-safely.md, The comparison): an eval's report as
the page shows it, with each session's two final answers split into runs of words that
both share and that only one has, so the difference can be marked without HTML.

The page renders text through Jinja's autoescaping only (never as markup).
"""

from __future__ import annotations

import difflib
import re
from typing import Any

#: Words and the whitespace after them: what the answer diff compares.
_TOKENS = re.compile(r"\S+\s*|\s+")
#: The longest answer the word diff compares (characters per side); past it, each side
#: is shown whole, marked changed (difflib is quadratic at worst).
MAX_DIFF_CHARS = 20_000


def word_diff(baseline: str, candidate: str) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The two answers as runs ``[{kind, text}]``: the baseline's ``same`` / ``del``
    runs, the candidate's ``same`` / ``add`` runs; joined, each side is its answer."""
    if len(baseline) > MAX_DIFF_CHARS or len(candidate) > MAX_DIFF_CHARS:
        same = baseline == candidate
        return (
            [{"kind": "same" if same else "del", "text": baseline}],
            [{"kind": "same" if same else "add", "text": candidate}],
        )
    old, new = _TOKENS.findall(baseline), _TOKENS.findall(candidate)
    left: list[dict[str, str]] = []
    right: list[dict[str, str]] = []
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            left.append({"kind": "same", "text": "".join(old[i1:i2])})
            right.append({"kind": "same", "text": "".join(new[j1:j2])})
            continue
        if i2 > i1:
            left.append({"kind": "del", "text": "".join(old[i1:i2])})
        if j2 > j1:
            right.append({"kind": "add", "text": "".join(new[j1:j2])})
    return left, right


def _get(data: Any, *keys: str) -> Any:
    """``data[k1][k2]…``, None where a level is missing (a partial or older report)."""
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def session_views(report: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each session of ``report`` as the page shows it: the report's own fields plus
    ``answer_runs`` (:func:`word_diff` of the final answers, baseline then candidate)."""
    views = []
    for item in _get(report, "sessions") or []:
        if not isinstance(item, dict):
            continue
        baseline = str(_get(item, "final", "baseline") or "")
        candidate = str(_get(item, "final", "candidate") or "")
        views.append({**item, "answer_runs": word_diff(baseline, candidate)})
    return views
