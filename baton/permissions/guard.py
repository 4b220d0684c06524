"""The guards every cross-agent path passes first, before ACL and policy: self-invocation
and the one-hop rule (Gamut X-Agent, docs/xagent.md).

Pure (no I/O, sandbox-safe): the session workflow calls :func:`cross_agent_guard` before
it schedules anything, and :func:`baton.permissions.gate.decide` calls it again for every
path that reaches an activity without the workflow.
"""

from __future__ import annotations

from pydantic import BaseModel

from baton.contracts.values import Via

#: Guard refusal codes (docs/xagent.md), returned to the model in the tool error.
SELF_INVOCATION = "self_invocation"
SELF_DELEGATION = "self_delegation"
ONE_HOP_VIOLATION = "one_hop_violation"


class GuardRefusal(BaseModel):
    """A guard's refusal: ``code`` (machine-readable) and the message the model reads."""

    code: str
    message: str


def cross_agent_guard(
    *, via: Via, caller: str, target: str | None, invoked: bool
) -> GuardRefusal | None:
    """The guards every cross-agent path passes first, before ACL and policy (docs/xagent.md).

    - self-invocation (Gamut X-Agent): an agent never makes itself run through
      invoke_agent (``self_invocation``), delegate_to, a route or a mention
      (``self_delegation``);
    - one hop (Gamut X-Agent, 'One-hop invocation rule', applied to every path): an
      invoked turn — any turn of a session another agent started, or a turn
      another agent sent — cannot make a third agent run (``one_hop_violation``).
      A subagent ``task`` of the agent's own published tree is exempt: the tree
      was bounded when it was published and the runtime depth ceiling bounds it.

    Pure (no I/O): the workflow calls it before scheduling anything and
    ``baton.permissions.gate.decide`` calls it again for every path that reaches an
    activity without the workflow (routes, mentions), so no path skips it.
    Returns None when the call may go on to the ACL and the policy.
    """
    if via == "task":
        return None
    if target is not None and target == caller:
        if via == "invoke":
            return GuardRefusal(code=SELF_INVOCATION, message="an agent cannot invoke itself")
        return GuardRefusal(code=SELF_DELEGATION, message="an agent cannot delegate to itself")
    if invoked:
        return GuardRefusal(
            code=ONE_HOP_VIOLATION,
            message=(
                "this session was invoked by another agent, and cross-agent invocation is "
                "limited to one hop: an invoked session cannot invoke or delegate to agents. "
                "Answer with what you have; the caller can invoke other agents itself."
            ),
        )
    return None
