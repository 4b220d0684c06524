"""Workflow inputs and outputs: what starts a session, a step or an inquiry, and the
arguments and results of their Signals and Updates.

Workflows cannot read settings or the environment, so the engine's configuration
travels in these inputs (``SessionConfig``); a run keeps the values it started with.
New fields always have defaults so histories recorded by older code still decode.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from baton.contracts.text import SafeText
from baton.contracts.tool_args import AgentInstructions, AgentName
from baton.contracts.values import (
    MAX_MESSAGE_CHARS,
    Decision,
    DeliveryConfig,
    ResolvedAgent,
    ResolvedLimits,
    TeamSnapshot,
    Usage,
)


class Provenance(BaseModel):
    """Who started a session and from where. Set by the engine only, never by API clients."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"created_by_user": "local"}]})

    created_by_user: str = "local"
    invoked_by_agent: str | None = None
    parent_session_id: str | None = None
    team: str | None = None
    depth: int = 0
    root_session_id: str | None = Field(
        default=None, description="The run's first session (None: this one is the root)."
    )
    delegation_id: str | None = None
    delegation_kind: str | None = Field(
        default=None, description="invoke | delegate_to | task | route | mention"
    )
    disable_delegation: bool = Field(default=False, description="Solo: no ad-hoc delegation.")
    team_member: bool = Field(
        default=False, description="A team member's isolated session: it cannot re-delegate."
    )
    run_limits: ResolvedLimits | None = Field(
        default=None, description="Limits of the run (the root agent's), carried down."
    )
    forked_from: str | None = Field(default=None, description="A fork: the original session.")
    fork_point: str | None = Field(
        default=None, description="A fork: the original's message it was forked after."
    )
    sandbox: bool = Field(default=False, description="Runs an agent's draft (the sandbox).")
    eval_id: str | None = Field(
        default=None, description="An eval's replay: the eval (BatonKind `eval`)."
    )
    replay_of: str | None = Field(
        default=None, description="An eval's replay: the recorded session it replays."
    )
    external: bool = Field(
        default=False,
        description="An external session, whose turns an outside process takes "
        "(over MCP); no model turn runs in it.",
    )
    workspace_id: str | None = Field(
        default=None,
        description="The workspace it works in when that is its caller's (a shareable "
        "subagent task or delegation, docs/workspaces.md); None: its own.",
    )


class SessionConfig(BaseModel):
    """Engine settings a session runs with (workflows cannot read settings or env)."""

    default_model: str | None = Field(
        default=None, description="BATON_MODEL at launch; the agent's own model wins."
    )
    max_steps_per_message: int = Field(
        default=12, description="Model calls one user message may cause (tool loops end here)."
    )
    max_run_sessions: int = Field(
        default=100, description="Sessions one run may start in all (every kind of delegation)."
    )
    max_tool_calls_per_reply: int = Field(
        default=16,
        description="Tool calls of one model reply that run; each further one is refused.",
    )
    model_turn_timeout_s: float = 600.0
    heartbeat_timeout_s: float = Field(
        default=5.0,
        description="Heartbeat timeout of long activities (model calls, tools, delegations): "
        "how soon a lost worker's activity is retried elsewhere; they beat at half of it.",
    )
    review_timeout_s: float = 300.0
    review_delivery_grace_s: float = Field(
        default=15.0,
        ge=0,
        description="How long past a review's deadline its wait stays open for a decision "
        "received by the deadline but not yet delivered (the API's Signal retried while "
        "Temporal or the worker is slow): such a decision still counts, one received later "
        "never does (review_in_time). The Temporal client's retries of a Signal give up "
        "after about 10 s, when the API answers 503 instead.",
    )
    max_delegation_depth: int = 3
    delegation_timeout_s: float = Field(
        default=900.0, description="How long one delegation (invoke_agent) may take."
    )
    auth: bool = Field(default=False, description="BATON_AUTH=on: ACL checks apply.")
    allow_adhoc_delegation: bool = Field(
        default=True,
        description="Roster agents are offered to ordinary sessions (AgentX Agent Teams).",
    )
    runtime_depth_ceiling: int = Field(
        default=8, description="No delegation nests deeper than this (Xema Agent Concepts)."
    )
    prices: dict[str, tuple[float, float]] = Field(
        default_factory=dict, description="Model prices (USD per million tokens) for metering."
    )
    continue_as_new_after_turns: int | None = Field(
        default=None,
        description="Also continue-as-new after this many turns (None = when suggested).",
    )
    # Recovery after a worker loss. Timeouts travel in the input
    # (workflows cannot read settings); a run keeps the values it was started with.
    store_timeout_s: float = Field(
        default=10.0,
        description="Start-to-close of DB-only activities (a lost worker costs this much).",
    )
    tool_timeout_s: float = Field(
        default=60.0, description="Start-to-close of an ordinary tool or X-Agent tool call."
    )
    model_attempts: int = Field(
        default=20,
        description="Attempts one model call may take, worker losses included (Temporal's "
        "maximum_attempts); provider failures are counted apart (model_provider_failures).",
    )
    model_provider_failures: int = Field(
        default=6,
        description="Retryable provider failures (5xx, 429, connection) after which a model "
        "call fails for good; a lost worker (heartbeat/start-to-close timeout) is not one.",
    )
    # token_budget reservations: what one model call may hold back from the budget.
    max_output_tokens: int = Field(
        default=4096,
        description="Under a token_budget: the most output tokens one model call may "
        "reserve (its max_tokens; also capped to what the budget has left).",
    )
    # Idle completion: a session's run ends once it has been idle this long
    # and its next message starts a new run of the same workflow id (baton.runs.launch).
    idle_timeout_s: float | None = Field(
        default=600.0,
        description="BATON_SESSION_IDLE_TIMEOUT: seconds an idle session's workflow waits "
        "for a message before it completes (None = never; runs from before it keep waiting).",
    )
    max_queued_messages: int = Field(
        default=8,
        description="BATON_MAX_QUEUED_MESSAGES: messages sent with if_busy=enqueue (or "
        "interrupt) a session holds while a turn runs; one more is refused queue_full.",
    )


#: What a message to a session running a turn asks for (docs/sessions.md, Messages while a
#: turn runs): refused ``session_busy``, run as the next turn, or the running turn stopped.
IfBusy = Literal["reject", "enqueue", "interrupt"]


class UserMessage(BaseModel):
    """Update ``send_message`` argument.

    ``invoked_by_agent`` is set by the ``delegate`` activity when another agent
    sends this message (invoke_agent with ``session_id``): that turn is an invoked
    one and may not invoke further (Gamut X-Agent, 'One-hop invocation rule').
    """

    prompt: str
    invoked_by_agent: str | None = None
    user: str | None = Field(
        default=None, description="Who sent it (auth mode: X-Agent ACL checks use this user)."
    )
    if_busy: IfBusy = Field(
        default="reject",
        description="While a turn runs: reject (session_busy), enqueue (run next, in order; "
        "queue_full past max_queued_messages) or interrupt (stop the running turn, run this).",
    )
    in_transcript: bool = Field(
        default=False,
        description="Already in the transcript (a fork after a user message): the turn "
        "answers it and stores no user message.",
    )


# Bounds of the review memory SessionInput carries, carried across continue-as-new.
#: Decisions a session keeps for reviews that already had their outcome or that it does
#: not know (the newest; reported by Query ``late_decisions``).
MAX_LATE_DECISIONS = 50
#: Settled review ids a session remembers, to tell a decision that came too late from one
#: naming a review it never had; older ids read as ``unknown_review``.
MAX_SETTLED_REVIEWS = 200


LateReason = Literal["too_late", "unknown_review", "invalid_decision"]


class LateDecision(BaseModel):
    """A ``review_decision`` Signal that changed nothing (Query ``late_decisions``).

    ``too_late``: the review had its outcome (a decision or the timeout) already, or
    the decision was received past its deadline; ``unknown_review``: no review of this
    session has that id (or it was settled more than :data:`MAX_SETTLED_REVIEWS`
    reviews ago); ``invalid_decision``: the Signal's argument is not a decision (a
    missing or bad value; ``decision`` is then None and ``review_id`` what it named).
    """

    review_id: str = Field(max_length=80)
    decision: Decision | None
    reason: LateReason


class SessionInput(BaseModel):
    """SessionWorkflow input. ``agent``, ``turn`` and the review memory are carried across
    continue-as-new, and into the session row (``resume_input``) when a run completes idle:
    the next message starts the next run from there (:func:`baton.runs.launch.deliver_update`)."""

    session_id: str
    agent_pin: str = Field(description="slug@version resolved at launch.")
    provenance: Provenance = Field(default_factory=Provenance)
    config: SessionConfig = Field(default_factory=SessionConfig)
    first_message: UserMessage | None = Field(
        default=None, description="Handled at start (used where Updates are unavailable)."
    )
    agent: ResolvedAgent | None = None
    turn: int = 0
    team: TeamSnapshot | None = Field(
        default=None, description="Team run: the team, members pinned at launch."
    )
    late_decisions: list[LateDecision] = Field(
        default_factory=list,
        max_length=MAX_LATE_DECISIONS,
        description="Carried across continue-as-new: the newest decisions that changed nothing.",
    )
    settled_reviews: list[str] = Field(
        default_factory=list,
        max_length=MAX_SETTLED_REVIEWS,
        description="Carried across continue-as-new: ids of the newest reviews this session "
        "settled, oldest first (a later decision for one is too_late, not unknown_review).",
    )


class TurnOutcome(BaseModel):
    """``send_message`` result: the final assistant message, preview first (full text is in
    the DB)."""

    preview: str = ""
    preview_is_full: bool = False
    usage: Usage = Field(default_factory=Usage)
    interrupted: bool = Field(
        default=False, description="A message sent with if_busy=interrupt stopped this turn."
    )
    #: Last, like every id in a result: the history reads as the conversation.
    message_id: str


def review_in_time(received_at: datetime, expires_at: datetime) -> bool:
    """Whether a decision received at ``received_at`` may still settle a review that
    expires at ``expires_at`` (both tz-aware): at the deadline yes, any later no.

    The one rule of the hard review timeout, applied by the API before it signals
    (409 ``review_too_late``) and by the workflow to the decision's signed
    ``received_at``, whenever the review's timer itself fires: a decision received in
    time but delivered late (Temporal or the worker down) still counts.
    """
    return received_at <= expires_at


ModelT = TypeVar("ModelT", bound=BaseModel)


def from_signal(model: type[ModelT], raw: object) -> ModelT | None:
    """A Signal's raw argument (JSON: a dict) as ``model``, or None when it is not one.

    A Signal handler must never raise (an exception fails the workflow task, on every
    retry) and cannot refuse its sender; a Signal whose argument cannot be decoded is
    dropped by the SDK unseen. So handlers take the raw argument and parse it here:
    fields ``model`` does not know are dropped (a Signal sent by hand may carry a
    note), a missing or bad value makes it None, for the handler to record or ignore.
    """
    if isinstance(raw, model):
        return raw
    if not isinstance(raw, dict):
        return None
    known = {k: v for k, v in raw.items() if k in model.model_fields}
    try:
        return model.model_validate(known)
    except ValidationError:
        return None


class ReviewDecision(BaseModel):
    """Signal ``review_decision`` argument (docs/xagent.md, Reviews).

    ``scope`` applies to ``always_allow``: ``target`` saves a per-target policy,
    ``all`` a global one (list is global only). ``decision_id`` lets the API tell
    whether its decision was the one applied.
    """

    review_id: str = Field(max_length=80)
    decision: Decision
    scope: Literal["target", "all"] | None = None
    decided_by: SafeText = Field(default="temporal-cli", min_length=1, max_length=200)
    decision_id: str | None = Field(default=None, max_length=80)
    received_at: AwareDatetime | None = Field(
        default=None,
        description="When the API received the decision (signed): one received after the "
        "review's deadline is too_late, whenever it is delivered. None (a raw Signal): the "
        "workflow's time when it handles it.",
    )
    edited_prompt: SafeText | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_MESSAGE_CHARS,
        description="allow_once or always_allow of an invoke: the prompt the target gets "
        "instead of the caller's (signed with the rest).",
    )
    edited_name: AgentName | None = Field(
        default=None,
        description="allow_once of a create: the name the new agent gets instead of the "
        "caller's (bounded as create_agent's own name; signed with the rest).",
    )
    edited_instructions: AgentInstructions | None = Field(
        default=None,
        description="allow_once of a create: the instructions the new agent gets instead "
        "of the caller's (bounded as create_agent's own; signed with the rest).",
    )
    proof: str | None = Field(
        default=None,
        max_length=128,
        description="HMAC-SHA256 (hex) the API or the worker adds "
        "(baton.permissions.reviews.prove); "
        "a decision without a valid one is recorded as 'temporal (unverified)'.",
    )


class StepRetry(BaseModel):
    """Attempts of a step: invalid deliverables and failed model calls are retried."""

    model_config = ConfigDict(
        extra="forbid",
        # POST /v1/steps takes it as is: `true` or `"3"` is refused, never coerced
        # (a typed API takes no guesses). Old histories decode unchanged: JSON numbers stay numbers.
        strict=True,
        json_schema_extra={
            "examples": [{"max_attempts": 3, "initial_interval_s": 1.0, "backoff_coefficient": 2.0}]
        },
    )

    max_attempts: int = Field(default=3, ge=1, le=20)
    initial_interval_s: float = Field(default=1.0, ge=0, le=3600, allow_inf_nan=False)
    backoff_coefficient: float = Field(default=2.0, ge=1, le=10, allow_inf_nan=False)

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (after attempt ``attempt`` failed)."""
        return float(self.initial_interval_s * self.backoff_coefficient ** (attempt - 1))


class StepInput(BaseModel):
    """AgentStepWorkflow input: the pinned agent, the input and the step's policy."""

    step_id: str
    agent_pin: str
    input: str
    output_schema: dict[str, Any] | None = None
    retry: StepRetry = Field(default_factory=StepRetry)
    handoff: bool = False
    handoff_timeout_s: float = 86_400.0
    timeout_s: float | None = None
    config: SessionConfig = Field(default_factory=SessionConfig)
    user: str = "local"


class HandoffDecision(BaseModel):
    """Signal ``handoff``: approve | revise (with feedback: another attempt) | reject."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"decision": "revise", "feedback": "Add sources."}]},
    )

    decision: Literal["approve", "revise", "reject"]
    feedback: SafeText | None = Field(default=None, max_length=MAX_MESSAGE_CHARS)
    edited_deliverable: Any = Field(
        default=None,
        description="approve: the deliverable the reviewer edited, kept instead of the "
        "agent's (it must pass the step's output_schema).",
    )


# Inquiries: questions to an ambassador about a session (AgentX Agent Teams).


class InquiryInput(BaseModel):
    """``Inquiry`` workflow input: who asks what about which session, set by the API only."""

    inquiry_id: str
    session_id: str
    user: str
    auth: bool = False
    ambassador_pin: str
    question: str
    default_model: str | None = None
    prices: dict[str, tuple[float, float]] = Field(default_factory=dict)
    max_steps: int = Field(default=8, description="Model calls one inquiry may make.")
    model_turn_timeout_s: float = SessionConfig.model_fields["model_turn_timeout_s"].default
    config: SessionConfig = Field(
        default_factory=SessionConfig,
        description="The engine's activity timeouts and retry budget (as a session's).",
    )


class InquiryResult(BaseModel):
    """What the Inquiry workflow returns: the stored status (answer text stays in the DB)."""

    inquiry_id: str
    status: Literal["answered", "failed"]
    steps: int = 0


# Agents outside Baton: external sessions over MCP (docs/mcp.md).

#: Update names on SessionWorkflow (stable once shipped).
EXTERNAL_TOOL_CALL = "external_tool_call"
EXTERNAL_MESSAGE = "external_message"


class ExternalToolCall(BaseModel):
    """Update ``external_tool_call``: one X-Agent tool call an external process made over
    MCP, run by the session's workflow exactly as a model's tool call (docs/xagent.md).

    ``call_id`` is the MCP layer's idempotency key (also the Update id's suffix); the
    workflow chooses where the result is stored. ``args`` are validated by the workflow
    with the same argument models as a model's call (``XAGENT_ARGS``).
    """

    call_id: str = Field(min_length=1, max_length=120)
    name: str = Field(max_length=64)
    args: dict[str, Any] = Field(default_factory=dict)


class ExternalMessage(BaseModel):
    """Update ``external_message``: a message the external process posts to its own
    transcript (``assistant``: what it did, for get_agent_session_transcript readers)."""

    role: Literal["user", "assistant"] = "assistant"
    text: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)


class ExternalMessageOutcome(BaseModel):
    """``external_message`` result: the stored message's id."""

    message_id: str


class DeliveryInput(BaseModel):
    """``WebhookDelivery`` workflow and ``deliver_webhook`` activity input: the delivery row
    to send (its body and signature come from the database, never from history) and the
    time it was queued (a row that has not appeared long after was rolled back)."""

    delivery_id: str
    queued_at: AwareDatetime
    config: DeliveryConfig = Field(default_factory=DeliveryConfig)


class EvalInput(BaseModel):
    """``Eval`` workflow input (docs/change-safely.md, Replay against a candidate): replay
    each of ``recorded`` (oldest first) on the candidate and the baseline, at most
    ``concurrency`` replays at once, as ``user``.

    ``candidate`` / ``baseline`` are pins (``slug@V``); ``candidate_agent`` /
    ``baseline_agent`` the draft's snapshot when that side runs the draft."""

    eval_id: str
    recorded: list[str]
    recorded_steps: list[str] = Field(
        default_factory=list,
        description="Recorded workflow-agent steps replayed too (their input, as a step "
        "with no handoff), after the sessions in the report.",
    )
    candidate: str
    baseline: str
    judge: str | None = Field(
        default=None,
        description="A model (as an agent spec's `model`) asked to compare each changed "
        "item's answers; None: no judge.",
    )
    candidate_agent: ResolvedAgent | None = None
    baseline_agent: ResolvedAgent | None = None
    user: str
    concurrency: int = Field(default=4, ge=1)
    task_queue: str
    config: SessionConfig
