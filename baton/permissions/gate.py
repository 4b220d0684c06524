"""One decision for every cross-agent path: guards, ACL, who allows it, policy (docs/xagent.md).

Every way one agent reaches another goes through :func:`decide`:

========================  =========  ========  ====  =======================  ==========
path (``via``)            self       one hop   ACL   the allow                policy
========================  =========  ========  ====  =======================  ==========
invoke (invoke_agent)     refused    refused   user  Gamut precedence          block refuses;
                                                                              no row reviews
delegate_to, team lead    refused    refused   user  team membership          block refuses
delegate_to, roster       refused    refused   user  the target's roster      block refuses
                                                     opt-in
route (a team route)      refused    refused   user  team membership          block refuses
mention (an @mention)     refused    refused   user  the human who wrote it   block refuses
task (own subagent)       —          exempt    user  the published tree       block refuses
list / read (X-Agent)     —          —         view  Gamut precedence          block refuses;
                                                                              no row reviews
create (X-Agent)          —          —         —     always a review          —
========================  =========  ========  ====  =======================  ==========

An ambassador (``kind: ambassador``) is never a target of a path that
makes it run: every such path is refused ``not_invocable`` right after the guards
(AgentX Agent Teams, 'Ambassador': it runs beside a conversation, never in one).

Sources: Gamut X-Agent (self-invocation guard, one-hop rule), Gamut X-Agent Policies (ACL before
policy, precedence per-target → global → review, create always reviews), seed
002 (team membership and the opt-in roster are what a human set up, so those
paths never open a review — but a stored ``block`` still refuses them). Limits
(depth, spawns, token budget) are checked after this, by the ``delegate``
activity under the run's lock, because they count what the run already started.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sqlmodel import Session, select

from baton.agents import registry, roster
from baton.contracts.codes import BLOCKED_BY_POLICY
from baton.contracts.values import TeamMemberSnapshot, TeamSnapshot, Via
from baton.grants import auth, policies
from baton.permissions.guard import cross_agent_guard
from baton.storage.db import Agent, AgentLivePointer

Verdict = Literal["allow", "review", "refuse"]
#: Refusal code for a path that would make an ambassador run.
NOT_INVOCABLE = "not_invocable"


@dataclass(frozen=True)
class Request:
    """One cross-agent call to decide.

    ``operation`` is the X-Agent Policies operation (list | read | invoke | create);
    ``via`` the path for anything that makes the target run (every such path is
    the ``invoke`` operation); ``invoked`` whether the calling turn is an invoked
    one (one-hop); ``user`` whose roles the ACL checks (auth mode only).
    """

    caller: str
    operation: str
    target: str | None
    user: str
    auth: bool
    invoked: bool = False
    via: Via | None = None
    team: TeamSnapshot | None = None


@dataclass(frozen=True)
class Decision:
    """``allow`` proceeds, ``review`` opens a review (invoke/list/read/create only),
    ``refuse`` is final: ``code`` and ``reason`` for the model, ``decided_by``
    (guard | acl | policy) when the refusal is audited as a block, else None."""

    verdict: Verdict
    code: str | None = None
    reason: str = ""
    decided_by: str | None = None
    #: delegate_to and routes in a team run: the member the call resolved to.
    member: TeamMemberSnapshot | None = None

    @property
    def text(self) -> str:
        """The refusal as the model reads it: ``code: reason``."""
        return f"{self.code}: {self.reason}"


def _refuse(code: str, reason: str, decided_by: str | None) -> Decision:
    return Decision(verdict="refuse", code=code, reason=reason, decided_by=decided_by)


def decide(session: Session, req: Request) -> Decision:
    """Decide one cross-agent call, in the order of the table above. Reads only.

    Refusal codes: ``self_invocation``, ``self_delegation``, ``one_hop_violation``
    (guards, audited), ``unknown_agent`` / ``agent_not_runnable`` (not audited:
    nothing to protect), ``access_denied`` (ACL, audited), ``not_a_member``,
    ``not_on_roster``, ``not_invocable`` (an ambassador; not audited: the path simply
    does not exist),
    ``blocked_by_policy`` (audited).
    """
    runs = req.via is not None
    if runs:
        assert req.via is not None
        guard = cross_agent_guard(
            via=req.via, caller=req.caller, target=req.target, invoked=req.invoked
        )
        if guard is not None:
            return _refuse(guard.code, guard.message, "guard")
        if req.target is not None and registry.is_ambassador(session, slug=req.target):
            return _refuse(
                NOT_INVOCABLE,
                f"'{req.target}' is an ambassador: it answers a person's inquiries and is "
                "never invoked or delegated to",
                None,
            )
    member: TeamMemberSnapshot | None = None
    if req.via in ("delegate_to", "route") and req.team is not None:
        member = next((m for m in req.team.specialists() if m.agent_id == req.target), None)
        if member is None:
            names = ", ".join(m.agent_id for m in req.team.specialists())
            who = f"its members: {names}" if names else "it has no members"
            return _refuse(
                "not_a_member", f"'{req.target}' is not a member of this team ({who})", None
            )
    elif req.via == "delegate_to" and req.target not in {
        slug for slug, _ in roster.roster(session, exclude=req.caller)
    }:
        return _refuse(
            "not_on_roster",
            f"'{req.target}' is not on the delegation roster "
            "(agents with delegation.available_for_delegation)",
            None,
        )
    if req.operation in ("read", "invoke") and req.via in (None, "invoke") and req.target:
        found = _runnable(session, req.target)
        if found is None:
            return _refuse(
                "unknown_agent", f"no agent '{req.target}'; call list_agents to find slugs", None
            )
        if req.operation == "invoke" and found != "live":
            return _refuse(
                "agent_not_runnable",
                f"agent '{req.target}' is {found} and cannot be invoked",
                None,
            )
    if req.auth and req.target is not None and req.operation != "create":
        need: auth.Role = "user" if req.operation == "invoke" else "viewer"
        if not auth.has_role(session, user_id=req.user, agent=req.target, role=need):
            return _refuse(
                "access_denied",
                f"{req.operation} on '{req.target}' needs the {need} role for user "
                f"'{req.user}', who does not have it",
                "acl",
            )
    verdict = policies.decide(
        session, caller=req.caller, operation=req.operation, target=req.target
    )
    if verdict == "block":
        what = f"{req.operation} '{req.target}'" if req.target else req.operation
        how = f" (via {req.via})" if req.via not in (None, "invoke") else ""
        return _refuse(
            BLOCKED_BY_POLICY,
            f"{req.caller} may not {what}{how}",
            "policy",
        )
    if verdict == "allow" or req.via not in (None, "invoke"):
        # Team membership, the roster opt-in, the human's @mention and the published
        # tree are the human's allow for those paths: they never wait on a review.
        return Decision(verdict="allow", member=member)
    return Decision(verdict="review")


def _runnable(session: Session, slug: str) -> Literal["live", "retired", "not published"] | None:
    agent = session.exec(select(Agent).where(Agent.slug == slug)).first()
    if agent is None:
        return None
    if session.get(AgentLivePointer, agent.id) is not None:
        return "live"
    return "retired" if agent.retired else "not published"
