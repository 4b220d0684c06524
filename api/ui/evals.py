"""The console's eval page (docs/change-safely.md, The comparison): an eval's report as
the page shows it, with each session's two final answers split into runs of words that
both share and that only one has, so the difference can be marked without HTML, and the
first messages of its two replays' transcripts as the page lists them.

The page renders text through Jinja's autoescaping only (never as markup).
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

from baton.runs.session_store import Transcript

#: Words and the whitespace after them: what the answer diff compares.
_TOKENS = re.compile(r"\S+\s*|\s+")
#: The longest answer the word diff compares (characters per side); past it, each side
#: is shown whole, marked changed (difflib is quadratic at worst).
MAX_DIFF_CHARS = 20_000
#: The messages of each replay's transcript the page shows; the replay's own session page
#: shows the rest.
TRANSCRIPT_SHOWN = 50
#: Who a message is from, by role (an assistant's: its agent).
_WHO = {"user": "user", "error": "error", "attachment": "attached"}


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


def pretty(text: str) -> str:
    """``text`` indented when it is a JSON object or array (a tool's output, as the session
    page shows it), else as it is; the page still shows it as text, never as markup."""
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return text
    try:
        return json.dumps(json.loads(stripped), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def transcript_view(transcript: Transcript | None) -> dict[str, Any] | None:
    """A replay's transcript page (``GET /v1/sessions/{id}/transcript``'s, at most
    :data:`TRANSCRIPT_SHOWN` messages) as the eval page lists it: ``{session_id, messages:
    [{role, who, text, tool_input, calls}], more}``; a tool's output indented
    (:func:`pretty`), an assistant turn's tool calls as their names, ``more`` when later
    messages were left out. None for no transcript (a replay not started, or gone)."""
    if transcript is None:
        return None
    messages = []
    for m in transcript.messages:
        tool = m.role == "tool"
        messages.append(
            {
                "role": m.role,
                "who": f"tool {m.tool_name or ''}".strip()
                if tool
                else _WHO.get(m.role) or m.agent or m.role,
                "text": pretty(m.text) if tool else m.text,
                "tool_input": m.tool_input,
                "calls": [str(c.get("name", "")) for c in m.tool_calls or []],
            }
        )
    return {
        "session_id": transcript.session_id,
        "messages": messages,
        "more": transcript.next_cursor is not None,
    }
