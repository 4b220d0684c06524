"""The read side of evals (docs/change-safely.md, Read an eval): one eval, an agent's
evals newest first, and their answers.

Who may read an eval is one rule, :func:`reader_scope`; it and :func:`get_eval` live with
the publish gate (:mod:`baton.agents.gate`, which the registry's publish calls and which
may import nothing above the agents layer) and are this module's too.
"""

from __future__ import annotations

from sqlmodel import Session, col

from baton.agents.gate import EvalNotFound, get_eval, reader_scope
from baton.contracts.evals import EvalReport, EvalSummary
from baton.storage.db import EvalRow, page

__all__ = [
    "EvalNotFound",
    "eval_report",
    "eval_summary",
    "get_eval",
    "list_evals",
    "reader_scope",
]


def list_evals(
    session: Session, *, slug: str, user: str | None, limit: int = 50, offset: int = 0
) -> tuple[list[EvalRow], int]:
    """Evals of agent ``slug`` that ``user`` may read (:func:`reader_scope`), newest first,
    one page of ``limit`` from ``offset``, and how many there are in all."""
    where = [col(EvalRow.agent_slug) == slug]
    owner = reader_scope(session, slug=slug, user=user)
    if owner is not None:
        where.append(col(EvalRow.owner) == owner)
    order = [col(EvalRow.created_at).desc(), col(EvalRow.id).desc()]
    return page(session, EvalRow, where=where, order_by=order, limit=limit, offset=offset)


def eval_summary(row: EvalRow) -> EvalSummary:
    """An eval's answer without its report (lists)."""
    return EvalSummary.model_validate(row.model_dump(exclude={"report"}))


def eval_report(row: EvalRow) -> EvalReport:
    """An eval's answer with its report (one eval)."""
    return EvalReport.model_validate(row.model_dump())
