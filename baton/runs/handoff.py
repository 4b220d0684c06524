"""A step's handoff (docs/steps.md): what each human decision on a deliverable leads to.

Pure: the ``AgentStep`` workflow applies it and the API reports it before the workflow has
stored it, so both read the one rule here.
"""

from __future__ import annotations

from baton.contracts.values import StepStatus
from baton.contracts.workflow_io import HandoffDecision

#: The prompt of the attempt after a ``revise`` begins with this (then the feedback): how
#: a step's transcript shows that it was revised.
REVISE_PROMPT = "Revise your deliverable. Feedback: "


def status_after(decision: HandoffDecision) -> StepStatus:
    """The step's status once ``decision`` is applied: ``approve`` completes the step,
    ``reject`` rejects it (the workflow fails with ``step_rejected``), ``revise`` runs
    another attempt with the feedback."""
    if decision.decision == "approve":
        return "completed"
    if decision.decision == "reject":
        return "rejected"
    return "running"
