"""X-Agent policies: allow / review / block per caller, operation and target (Gamut X-Agent
Policies).

Stored rows are ``allow`` or ``block``; ``review`` is the absence of a row.
Precedence is most-specific first: the per-target row, then the caller's global
row, then review (Gamut X-Agent Policies, 'Policy precedence'). ``create`` is never stored:
every create_agent call reviews.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from sqlmodel import Session, col, select

from baton.contracts.text import SLUG_PATTERN
from baton.errors import AgentNotFound, BatonError
from baton.storage.db import Agent, XAgentPolicy, utcnow

PolicyValue = Literal["allow", "review", "block"]
Verdict = Literal["allow", "review", "block"]
#: Operations a policy may name; create always reviews.
POLICY_OPERATIONS = ("list", "read", "invoke")


class InvalidPolicy(BatonError):
    """A policy document names itself or an operation that cannot be stored (422)."""

    code = "invalid_policy"
    status = 422
    title = "Invalid policy"


class GlobalPolicies(BaseModel):
    """The caller's workspace-wide defaults (Gamut X-Agent Policies, 'Global permissions')."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"list": "allow", "read": "review", "invoke": "allow"}]},
    )

    list: PolicyValue = "review"
    read: PolicyValue = "review"
    invoke: PolicyValue = "review"


class TargetPolicies(BaseModel):
    """Per-target overrides (Gamut X-Agent Policies, 'Per-agent permissions')."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"read": "allow", "invoke": "block"}]}
    )

    read: PolicyValue = "review"
    invoke: PolicyValue = "review"


class Policies(BaseModel):
    """``GET|PUT /v1/agents/{slug}/policies``: every value allow | review | block.

    ``review`` means no stored row. A PUT replaces the caller's whole policy set;
    targets left out (or all-review) have no rows.
    """

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "global": {"list": "allow", "read": "review", "invoke": "allow"},
                    "targets": {"fact-checker": {"read": "allow", "invoke": "block"}},
                }
            ]
        },
    )

    global_: GlobalPolicies = Field(default_factory=GlobalPolicies, alias="global")
    targets: dict[Annotated[str, Field(pattern=SLUG_PATTERN)], TargetPolicies] = Field(
        default_factory=dict, max_length=1000
    )


def decide(session: Session, *, caller: str, operation: str, target: str | None) -> Verdict:
    """The effective decision for one operation (Gamut X-Agent Policies, 'Policy precedence').

    ``create`` always reviews. For list, only the global row counts.
    """
    if operation not in POLICY_OPERATIONS:
        return "review"
    rows = session.exec(
        select(XAgentPolicy).where(
            XAgentPolicy.caller_agent_slug == caller, XAgentPolicy.operation == operation
        )
    ).all()
    specific = next((r for r in rows if target and r.target_agent_slug == target), None)
    if specific is not None:
        return specific.decision  # type: ignore[return-value]
    general = next((r for r in rows if r.target_agent_slug is None), None)
    if general is not None:
        return general.decision  # type: ignore[return-value]
    return "review"


def save_policy(
    session: Session, *, caller: str, operation: str, target: str | None, decision: str
) -> None:
    """Insert or update one row (``review`` deletes it). Flushes."""
    if operation not in POLICY_OPERATIONS:
        raise InvalidPolicy(f"no policy can be stored for '{operation}'")
    stmt = select(XAgentPolicy).where(
        XAgentPolicy.caller_agent_slug == caller,
        XAgentPolicy.operation == operation,
        col(XAgentPolicy.target_agent_slug).is_(None)
        if target is None
        else XAgentPolicy.target_agent_slug == target,
    )
    row = session.exec(stmt).first()
    if decision == "review":
        if row is not None:
            session.delete(row)
    elif row is None:
        session.add(
            XAgentPolicy(
                caller_agent_slug=caller,
                target_agent_slug=target,
                operation=operation,
                decision=decision,
            )
        )
    else:
        row.decision = decision
        row.updated_at = utcnow()
        session.add(row)
    session.flush()


def _exists(session: Session, slug: str) -> bool:
    return session.exec(select(Agent.id).where(Agent.slug == slug)).first() is not None


def get_policies(session: Session, *, caller: str) -> Policies:
    """The caller's policies. Raises AgentNotFound."""
    if not _exists(session, caller):
        raise AgentNotFound(f"no agent '{caller}'")
    rows = session.exec(
        select(XAgentPolicy)
        .where(XAgentPolicy.caller_agent_slug == caller)
        .order_by(col(XAgentPolicy.target_agent_slug))
    ).all()
    out = Policies()
    for r in rows:
        if r.target_agent_slug is None:
            setattr(out.global_, r.operation, r.decision)
        elif r.operation in ("read", "invoke"):
            entry = out.targets.setdefault(r.target_agent_slug, TargetPolicies())
            setattr(entry, r.operation, r.decision)
    return out


def put_policies(
    session: Session, *, caller: str, policies: Policies, visible: list[str] | None = None
) -> Policies:
    """Replace the caller's policies. Flushes.

    ``visible`` (auth mode) is what the writer can see: rows for other targets
    are kept as they are (a GET hid them, so a GET→PUT round trip must not erase
    them), and naming one is refused exactly like an unknown agent.

    Raises AgentNotFound (caller or a target) and InvalidPolicy (a target equal
    to the caller: an agent can never invoke itself, so the row would be noise).
    """
    if not _exists(session, caller):
        raise AgentNotFound(f"no agent '{caller}'")
    for target in policies.targets:
        if target == caller:
            raise InvalidPolicy("an agent cannot name itself as a target", path=f"targets.{target}")
        if not _exists(session, target) or (visible is not None and target not in visible):
            raise AgentNotFound(f"no agent '{target}'", path=f"targets.{target}")
    for row in session.exec(
        select(XAgentPolicy).where(XAgentPolicy.caller_agent_slug == caller)
    ).all():
        hidden = (
            visible is not None
            and row.target_agent_slug is not None
            and row.target_agent_slug not in visible
        )
        if not hidden:
            session.delete(row)
    session.flush()
    for op in POLICY_OPERATIONS:
        value = getattr(policies.global_, op)
        if value != "review":
            save_policy(session, caller=caller, operation=op, target=None, decision=value)
    for target, entry in policies.targets.items():
        for op in ("read", "invoke"):
            value = getattr(entry, op)
            if value != "review":
                save_policy(session, caller=caller, operation=op, target=target, decision=value)
    current = get_policies(session, caller=caller)
    if visible is not None:
        current.targets = {t: p for t, p in current.targets.items() if t in visible}
    return current


def delete_for_agent(session: Session, *, slug: str) -> int:
    """Delete every row naming ``slug`` as caller or target (Gamut X-Agent Policies);
    returns the count."""
    rows = session.exec(
        select(XAgentPolicy).where(
            (XAgentPolicy.caller_agent_slug == slug) | (XAgentPolicy.target_agent_slug == slug)
        )
    ).all()
    for row in rows:
        session.delete(row)
    session.flush()
    return len(rows)
