"""The publish gate (docs/change-safely.md, 'The publish gate'): which eval lets a draft
be published, and the refusals when none does; and who may read an eval
(:func:`reader_scope`, :func:`get_eval`), which the gate and the read side
(:mod:`baton.evals.store`) share.

Who may read an eval: with auth off, everyone; in auth mode, its owner (who started it)
and the agent's owners (the owner role: who may publish, and so decide on the gate).
Another user's eval is 404 ``eval_not_found``, as another user's webhook is, so an
answer never tells it exists.

:func:`passing_eval` is the one check; :func:`baton.agents.registry.publish`, the path
of every publish (the API, ``baton agents publish``, ``baton apply`` with or without the
API), calls it with the gate in force, and the revision records the eval it returns.
"""

from __future__ import annotations

from sqlmodel import Session, col, select

from baton.contracts import codes
from baton.contracts.evals import PublishGate
from baton.errors import Conflict, NotFound
from baton.grants import auth
from baton.storage.db import EvalRow

#: Candidate references that name the draft.
DRAFT = "draft"


class EvalNotFound(NotFound):
    """No eval with that id under that agent that the caller may read (404)."""

    code = codes.EVAL_NOT_FOUND


def reader_scope(session: Session, *, slug: str, user: str | None) -> str | None:
    """Whose evals of agent ``slug`` ``user`` may read: None = everyone's (auth off, or
    ``user`` holds the owner role on ``slug``), else only ``user``'s own. ``user`` is
    None with auth off."""
    if user is None or auth.has_role(session, user_id=user, agent=slug, role="owner"):
        return None
    return user


def get_eval(
    session: Session, *, eval_id: str, user: str | None, slug: str | None = None
) -> EvalRow:
    """The eval ``eval_id`` (of agent ``slug`` when given) that ``user`` may read
    (:func:`reader_scope`; ``user`` None with auth off). Raises EvalNotFound (404
    ``eval_not_found``) for a missing eval, one of another agent and a hidden one alike."""
    row = session.get(EvalRow, eval_id)
    if row is not None and (slug is None or row.agent_slug == slug):
        owner = reader_scope(session, slug=row.agent_slug, user=user)
        if owner is None or row.owner == owner:
            return row
    raise EvalNotFound(f"no eval '{eval_id}'" + (f" of agent '{slug}'" if slug else ""))


class EvalRequired(Conflict):
    """A gate applies and no completed eval of this draft exists (409)."""

    code = codes.EVAL_REQUIRED
    title = "An eval of the draft is required"


class EvalFailed(Conflict):
    """The eval does not meet the gate, or is not a completed eval of this draft (409);
    the problem names the eval (``eval_id``) and what failed (``failed``)."""

    code = codes.EVAL_FAILED
    title = "The eval does not meet the publish gate"


def _is_draft(row: EvalRow, slug: str) -> bool:
    return row.candidate in (DRAFT, f"{slug}@{DRAFT}")


def _unmet(row: EvalRow, *, slug: str, digest: str, gate: PublishGate) -> tuple[str, str] | None:
    """What keeps ``row`` from passing ``gate`` for the draft of ``slug`` with ``digest``,
    as ``(failed, why)``; None when it passes. ``failed`` is ``agent``, ``candidate``,
    ``status`` or the limit's name (``eval_sessions``, ``max_changed``,
    ``max_regressions``)."""
    if row.agent_slug != slug:
        return "agent", f"it is an eval of agent '{row.agent_slug}'"
    if not _is_draft(row, slug) or row.candidate_digest != digest:
        return "candidate", "it replayed another draft or revision (the draft changed since?)"
    if row.status != "completed":
        return "status", f"it is {row.status}, not completed"
    if row.total < gate.eval_sessions:
        return (
            "eval_sessions",
            f"it replayed {row.total} sessions; the gate needs {gate.eval_sessions}",
        )
    if row.changed > gate.max_changed:
        return "max_changed", f"{row.changed} sessions changed; the gate allows {gate.max_changed}"
    if row.regressions > gate.max_regressions:
        return (
            "max_regressions",
            f"{row.regressions} sessions regressed; the gate allows {gate.max_regressions}",
        )
    return None


def passing_eval(
    session: Session,
    *,
    slug: str,
    digest: str,
    gate: PublishGate,
    eval_id: str | None,
    user: str | None,
) -> EvalRow:
    """The eval that lets the draft of ``slug`` (spec digest ``digest``, as
    :func:`baton.agents.spec.spec_digest` computes it) be published under ``gate``.

    ``eval_id`` names it; without one, the newest completed eval of this draft is taken.
    It passes when it is of ``slug``, its candidate is the draft with ``digest``, it is
    completed, and ``total >= eval_sessions``, ``changed <= max_changed``,
    ``regressions <= max_regressions``. Only evals ``user`` may read count (``user``
    None with auth off; :func:`reader_scope`). Raises EvalNotFound
    (404) for an ``eval_id`` the user cannot read, EvalRequired (409) when there is
    none, EvalFailed (409, with ``eval_id``, ``failed``, ``gate``) for one that does
    not pass.
    """
    if eval_id is not None:
        row = get_eval(session, eval_id=eval_id, user=user)
    else:
        where = [
            col(EvalRow.agent_slug) == slug,
            col(EvalRow.candidate).in_([DRAFT, f"{slug}@{DRAFT}"]),
            col(EvalRow.candidate_digest) == digest,
            col(EvalRow.status) == "completed",
        ]
        owner = reader_scope(session, slug=slug, user=user)
        if owner is not None:
            where.append(col(EvalRow.owner) == owner)
        stmt = select(EvalRow).where(*where)
        newest = stmt.order_by(col(EvalRow.created_at).desc(), col(EvalRow.id).desc())
        found = session.exec(newest.limit(1)).first()
        if found is None:
            raise EvalRequired(
                f"agent '{slug}' has a publish gate ({_describe(gate)}): run an eval of the "
                f"draft (`baton eval {slug}`) that meets it, then publish",
                gate=gate.model_dump(),
            )
        row = found
    unmet = _unmet(row, slug=slug, digest=digest, gate=gate)
    if unmet is not None:
        failed, why = unmet
        raise EvalFailed(
            f"eval '{row.id}' does not meet the publish gate of '{slug}': {why}",
            eval_id=row.id,
            failed=failed,
            gate=gate.model_dump(),
        )
    return row


def _describe(gate: PublishGate) -> str:
    return (
        f"at least {gate.eval_sessions} sessions, at most {gate.max_changed} changed and "
        f"{gate.max_regressions} regressions"
    )
