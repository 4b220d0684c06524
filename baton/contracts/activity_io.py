"""Activity inputs and results: what a workflow hands an activity and what it gets back.

Ids (message ids, positions) are chosen by the workflow, so a retried activity writes
the same rows; texts stay in the database and only previews cross (claim-check).
New fields always have defaults so histories recorded by older code still decode.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, Field

from baton.contracts.tool_args import AgentInstructions, AgentName
from baton.contracts.values import (
    McpServerRef,
    Operation,
    ResolvedAgent,
    ResolvedLimits,
    ReviewOutcome,
    SessionStatus,
    StepStatus,
    TeamSnapshot,
    ToolCall,
    Usage,
    Via,
)
from baton.contracts.workflow_io import (
    HandoffDecision,
    InquiryInput,
    ReviewDecision,
    SessionConfig,
    SessionInput,
)


class ResumePoint(BaseModel):
    """``record_resume`` input, stored as ``sessions.resume_input``: where the next
    workflow run of a session whose run completed idle starts."""

    input: SessionInput = Field(description="The next run's input (the carried state).")
    task_queue: str = Field(description="The queue of the run that completed (and the next).")


class LoadAgentInput(BaseModel):
    """``load_agent`` activity input."""

    session_id: str
    agent_pin: str


class DelegationOffer(BaseModel):
    """Delegation tools a model turn offers (the activity builds their schemas)."""

    team: TeamSnapshot | None = Field(default=None, description="Supervisor of a team run.")
    adhoc: bool = Field(default=False, description="Offer the ad-hoc roster.")
    task: bool = Field(default=False, description="The agent has subagents: offer `task`.")


class ModelTurnInput(BaseModel):
    """``model_turn`` activity input: ids chosen by the workflow, no transcript (claim-check)."""

    session_id: str
    agent_slug: str
    turn: int
    step: int
    assistant_message_id: str
    position: str
    user_message_id: str | None = None
    user_text: str | None = None
    user_position: str | None = None
    default_model: str | None = None
    delegation: DelegationOffer | None = Field(
        default=None, description="Which delegation tools this turn offers."
    )
    run_root: str | None = Field(default=None, description="Root session of the run.")
    prices: dict[str, tuple[float, float]] = Field(
        default_factory=dict, description="BATON_PRICES: USD per million input/output tokens."
    )
    token_budget: int | None = Field(default=None, description="The run's token budget.")
    max_output_tokens: int = Field(
        default=4096,
        description="Under a token budget: the most output tokens this call may reserve.",
    )
    provider_failures: int = Field(
        default=6,
        description="Retryable provider failures after which the call fails for good.",
    )
    workspace: bool = Field(
        default=False,
        description="Offer the workspace tools (a session's turn; a step has no workspace).",
    )


# Results that the Temporal UI shows (activity results, Update results)
# put their readable preview first and ids last, so the event history reads like the run.
# Fields are encoded in declaration order; decoding is by name, so histories recorded with
# the old order decode unchanged (replayed in tests/test_replay.py).


class ModelTurnResult(BaseModel):
    """What the workflow needs from a model call: a preview, tool calls, usage, the id."""

    preview: str = ""
    preview_is_full: bool = Field(default=False, description="The preview is the whole text.")
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    message_id: str


class ToolInput(BaseModel):
    """``run_tool`` activity input."""

    session_id: str
    agent_slug: str
    message_id: str
    position: str
    call: ToolCall
    allowed_tools: list[str] = Field(default_factory=list)


class ToolOutcome(BaseModel):
    """A tool result as the workflow sees it: preview first (the full output is in the DB)."""

    preview: str = ""
    ok: bool
    message_id: str


class TurnFailure(BaseModel):
    """``record_failure`` activity input: a turn that could not complete."""

    session_id: str
    agent_slug: str
    message_id: str
    position: str
    error: str
    final_status: SessionStatus = Field(
        default="idle", description="`failed` when the session cannot go on at all."
    )


class StatusChange(BaseModel):
    """``set_status`` activity input."""

    session_id: str
    status: SessionStatus


class ToolMessage(BaseModel):
    """Where a tool call's result is stored: the session, message id and position."""

    session_id: str
    agent_slug: str
    message_id: str
    position: str
    call: ToolCall


class AuthorizeInput(BaseModel):
    """``authorize`` activity input: ACL then policy for one X-Agent call (Gamut X-Agent
    Policies)."""

    tool: ToolMessage
    user: str
    operation: Operation
    target: str | None = None
    review_id: str
    preview: str = ""
    auth: bool = False
    invoked: bool = Field(
        default=False, description="The calling turn is an invoked one (Gamut X-Agent, one hop)."
    )
    expires_at: datetime | None = Field(
        default=None,
        description="The review's deadline, fixed by the workflow before it asks "
        "(stored on the review row when one is opened).",
    )


class AuthorizeResult(BaseModel):
    """``allow`` proceeds, ``review`` waits for a decision, ``refused`` is final."""

    decision: Literal["allow", "review", "refused"]
    outcome: ToolOutcome | None = None


class AgentEdit(BaseModel):
    """A proven reviewer's edit of an allowed ``create_agent`` call (docs/xagent.md,
    Reviews): the new agent's name and/or instructions instead of the caller's (None: the
    caller's stands), bounded as the tool's own arguments, and who edited."""

    name: AgentName | None = None
    instructions: AgentInstructions | None = None
    by: str


class XAgentCall(BaseModel):
    """``xagent_tool`` activity input: list / create / read operations, after policy."""

    tool: ToolMessage
    user: str
    auth: bool = False
    edited_agent: AgentEdit | None = Field(
        default=None,
        description="create_agent: the reviewer's edit, applied to the call's arguments "
        "(the caller's tool result says so).",
    )


class SettleInput(BaseModel):
    """``settle_review`` activity input: the one outcome of a review."""

    tool: ToolMessage
    review_id: str
    operation: Operation
    target: str | None = None
    outcome: ReviewOutcome
    decision: ReviewDecision | None = None
    timeout_s: float = Field(
        default=SessionConfig.model_fields["review_timeout_s"].default,
        description="The review's timeout (the session's review_timeout_s).",
    )
    auth: bool = Field(
        default=False, description="Auth mode: an unproven decision never saves a policy."
    )
    then: XAgentCall | None = Field(
        default=None,
        description="A list or read to run as ``xagent_tool`` runs it once the review is "
        "settled allowed, in the same activity: one local activity and thread hop between "
        "the decision and the stored tool result, not two.",
    )


class SettleResult(BaseModel):
    """Whether the operation may proceed; the refusal's tool result when it may not, and
    the result of ``SettleInput.then`` when it ran."""

    allowed: bool
    outcome: ToolOutcome | None = None
    ran: ToolOutcome | None = None
    edited_prompt: str | None = Field(
        default=None, description="An allowed invoke: the proven reviewer's edit of its prompt."
    )
    edited_by: str | None = None
    edited_agent: AgentEdit | None = Field(
        default=None, description="An allowed create: the proven reviewer's edit."
    )


class RefusalInput(BaseModel):
    """``refuse_tool`` activity input: a guard or argument error, with its audit row."""

    tool: ToolMessage
    error: str
    code: str
    operation: Operation | None = None
    target: str | None = None
    audit: bool = True
    via: Via | None = None


class DelegateInput(BaseModel):
    """``delegate`` activity input (docs/architecture.md, delegation): start or continue a
    target session."""

    tool: ToolMessage
    delegation_id: str
    caller_session_id: str
    user: str
    target: str
    prompt: str
    session_id: str | None = None
    sync: bool = False
    task_queue: str
    config: SessionConfig
    depth: int = 1
    kind: Via = Field(default="invoke", description="invoke | delegate_to | task | route | mention")
    alias: str | None = Field(default=None, description="task: the subagent's alias.")
    root_session_id: str | None = None
    team: TeamSnapshot | None = None
    run_limits: ResolvedLimits | None = None
    disable_delegation: bool = False
    invoked: bool = Field(
        default=False, description="The calling turn is an invoked one (Gamut X-Agent, one hop)."
    )
    edited_by: str | None = Field(
        default=None,
        description="The reviewer who edited ``prompt`` before it was sent (the caller's "
        "tool result says so).",
    )


class RouteInput(BaseModel):
    """``route_turn`` activity input: does this message go straight to another agent?"""

    session_id: str
    agent_slug: str
    prompt: str
    team: TeamSnapshot | None = None
    user_message_id: str
    user_position: str
    route_message_id: str
    route_position: str
    call_id: str


class RouteDecision(BaseModel):
    """``kind`` route (a team route) or mention (an @agent); ``call`` is the routed
    ``delegate_to`` call stored in the transcript (None: not routed)."""

    kind: Literal["route", "mention"] = "route"
    target: str = ""
    call: ToolCall | None = None


class StepUpdate(BaseModel):
    """``update_step`` activity input: the step row's new state."""

    step_id: str
    status: StepStatus
    attempts: int = 0
    deliverable: Any = None
    error: str | None = None
    #: While ``awaiting_handoff``: when the handoff times out (the webhook event says).
    handoff_deadline: AwareDatetime | None = None


class DeliverableCheck(BaseModel):
    """``check_deliverable`` activity input: the final message and the schema (or none)."""

    step_id: str
    message_id: str
    output_schema: dict[str, Any] | None = None


class EditCheck(BaseModel):
    """``check_edited_deliverable`` activity input: a handoff decision carrying an edited
    deliverable, and the step's schema (or none)."""

    step_id: str
    decision: HandoffDecision
    output_schema: dict[str, Any] | None = None


class DeliverableResult(BaseModel):
    """The parsed deliverable, or the validation errors to feed back to the model."""

    ok: bool
    deliverable: Any = None
    errors: list[str] = Field(default_factory=list)


class InquiryTurnInput(BaseModel):
    """``inquiry_turn`` activity input: ids chosen by the workflow (claim-check)."""

    inquiry: InquiryInput
    step: int
    message_id: str
    position: str


class InquiryToolInput(BaseModel):
    """``inquiry_tool`` activity input: one tool call of the ambassador."""

    inquiry: InquiryInput
    message_id: str
    position: str
    call: ToolCall


class InquiryFinish(BaseModel):
    """``finish_inquiry`` activity input: the final answer (or the failure) to store."""

    inquiry_id: str
    answer_message_id: str | None = None
    steps: int = 0
    error: str | None = None
    capped: bool = Field(default=False, description="The step cap ended the loop.")


class ExternalMessageInput(BaseModel):
    """``record_external_message`` activity input: the id and position the workflow chose."""

    session_id: str
    agent_slug: str
    message_id: str
    position: str
    role: Literal["user", "assistant"]
    text: str


class McpToolInput(BaseModel):
    """``mcp_tool`` activity input: one ``<server>.<tool>`` call of the model (docs/mcp.md)."""

    tool: ToolMessage
    server: McpServerRef
    name: str
    input_schema: dict[str, Any] = Field(default_factory=dict)


class DeliveryFailure(BaseModel):
    """``fail_delivery`` input: the error the last attempt ended with (docs/webhooks.md)."""

    delivery_id: str
    error: str


class ReplayInput(BaseModel):
    """``replay`` activity input (docs/change-safely.md, Replay against a candidate): replay
    ``recorded``'s user turns on one side of eval ``eval_id``, as ``user``.

    ``ref`` is the side's pin (``slug@V``); ``agent`` the draft's snapshot when the side
    runs the draft (the sandbox), else None."""

    eval_id: str
    recorded: str
    side: Literal["baseline", "candidate"]
    ref: str
    agent: ResolvedAgent | None = None
    user: str
    task_queue: str
    config: SessionConfig


class ReplayOutcome(BaseModel):
    """What one replay did (``replay`` activity result): its session, the final answer,
    the tool sequence, the cross-agent decisions (``{operation, target, decision,
    outcome}``), whether its deliverable passed its schema (None: no deliverable), usage
    (tokens, USD), latency (ms, first message to last) and its last error."""

    session_id: str
    final: str = ""
    tools: list[str] = Field(default_factory=list)
    decisions: list[dict[str, Any]] = Field(default_factory=list)
    deliverable_valid: bool | None = None
    tokens: int = 0
    cost_usd: float = 0.0
    latency_ms: int = 0
    error: str | None = None
    deliverable: Any = Field(default=None, description="A step replay's deliverable.")
    attempts: int = Field(default=0, description="A step replay's attempts used.")


class JudgeInput(BaseModel):
    """``judge_replays`` activity input: ask model ``judge`` about recorded item
    ``recorded`` of eval ``eval_id`` (of agent ``agent_slug``), priced by ``prices``."""

    eval_id: str
    recorded: str
    agent_slug: str
    judge: str
    prices: dict[str, tuple[float, float]] = Field(default_factory=dict)


class ReplayPair(BaseModel):
    """``record_replays`` activity input: one recorded session's (or, ``kind`` ``step``,
    one recorded step's) two replays, done."""

    eval_id: str
    recorded: str
    baseline: ReplayOutcome
    candidate: ReplayOutcome
    kind: Literal["session", "step"] = "session"


class EvalEnd(BaseModel):
    """``finish_eval`` activity input: the status an eval ends with and why."""

    eval_id: str
    status: Literal["completed", "failed", "cancelled"]
    error: str | None = None
