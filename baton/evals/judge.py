"""The optional judge of an eval (docs/change-safely.md, The judge): a model, named as an
agent spec's ``model`` is and built by the same model layer (:mod:`baton.providers.models`),
asked whether a changed item's candidate answer is better than, the same as or worse than
the baseline's. Its answer is ``{verdict: better | same | worse, reason}``; a "worse" counts
as a regression.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError
from pydantic_ai.exceptions import UserError

from baton.errors import BatonError
from baton.providers.models import SCRIPTED, build_model

#: Characters of each side's answer the judge is shown.
MAX_JUDGED_CHARS = 8_000
#: Characters of the judge's reason kept in the report.
MAX_REASON_CHARS = 1_000

INSTRUCTIONS = (
    "You compare two answers of an AI agent to the same conversation: the BASELINE (the "
    "agent as it is) and the CANDIDATE (a changed agent). Judge whether the candidate is "
    "better, the same, or worse than the baseline for the user. Reply with only a JSON "
    'object: {"verdict": "better" | "same" | "worse", "reason": "<one sentence>"}.'
)


class UnknownJudge(BatonError):
    """The judge names no model this deployment can build (an unknown provider, a missing
    key or package), or the scripted model (it answers only from an agent's playbook)."""

    code = "unknown_judge"
    status = 422
    title = "Unknown judge model"


class Verdict(BaseModel):
    """The judge's answer on one changed item."""

    verdict: Literal["better", "same", "worse"]
    reason: str = Field(default="", max_length=MAX_REASON_CHARS)


def check_judge(name: str) -> None:
    """Raise UnknownJudge (422) unless ``name`` builds a model (the rule of
    :func:`~baton.providers.models.build_model`, in this process's environment)."""
    if name == SCRIPTED:
        raise UnknownJudge(
            "the scripted model answers from an agent's playbook and cannot judge; name a "
            "provider model such as 'openai:gpt-4o'",
            path="judge",
        )
    try:
        build_model(name, playbook=None, agent_slug="judge")
    except UserError as exc:
        raise UnknownJudge(f"judge model '{name}' is not configured: {exc}", path="judge") from exc


def prompt(item: dict[str, Any]) -> str:
    """The judge's prompt for one report item (a session's final answers, a step's
    deliverables)."""
    what = "deliverable (JSON)" if item.get("kind") == "step" else "final answer"
    final = item["final"]
    return (
        f"Each side's {what}.\n\nBASELINE:\n{final['baseline'][:MAX_JUDGED_CHARS]}\n\n"
        f"CANDIDATE:\n{final['candidate'][:MAX_JUDGED_CHARS]}"
    )


def parse(text: str) -> Verdict:
    """The verdict in the judge's reply: its first JSON object. Raises ValueError when
    there is none or it is not ``{verdict, reason}``."""
    found = re.search(r"\{.*\}", text, re.DOTALL)
    if found is None:
        raise ValueError(f"the judge's reply holds no JSON object: {text[:200]!r}")
    try:
        raw = json.loads(found.group(0))
        if isinstance(raw, dict) and isinstance(raw.get("reason"), str):
            raw["reason"] = raw["reason"][:MAX_REASON_CHARS]
        return Verdict.model_validate(raw)
    except (json.JSONDecodeError, ValidationError) as exc:
        raise ValueError(f"the judge's reply is no verdict: {text[:200]!r}") from exc
