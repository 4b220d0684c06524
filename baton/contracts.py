"""Pydantic models that cross the Temporal boundary (workflow inputs, activity results).

Sandbox-safe: no I/O, no settings, no SQLModel tables. New fields always have
defaults so histories recorded by older code still decode.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes


class ResolvedLimits(BaseModel):
    """Effective limits: the minimum of every value set along the chain; null = unbounded."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"max_depth": 2, "max_spawns": None, "token_budget": 100000}]
        }
    )

    max_depth: int | None = None
    max_spawns: int | None = None
    token_budget: int | None = None


class ResolvedDelegation(BaseModel):
    """Effective ad-hoc delegation settings."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"available_for_delegation": True, "delegation_hint": "writes reports"}]
        }
    )

    available_for_delegation: bool = False
    delegation_hint: str | None = None


class ResolvedNode(BaseModel):
    """A subagent node after resolution: the referenced agent pinned, tools narrowed."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "alias": "checker",
                    "agent": "fact-checker",
                    "version": 2,
                    "system_prompt": "Check claims.",
                    "tools": ["web_search"],
                    "allowed_tools": ["web_search"],
                    "blocked_tools": ["shell"],
                }
            ]
        }
    )

    alias: str
    agent: str = Field(description="Slug of the referenced agent.")
    version: int = Field(description="Revision the reference resolved to.")
    system_prompt: str = ""
    model: str | None = None
    tools: list[str] = Field(default_factory=list, description="Tools this node may use.")
    allowed_tools: list[str] | None = Field(
        default=None, description="Envelope inherited by children; null = no envelope."
    )
    blocked_tools: list[str] = Field(default_factory=list)
    limits: ResolvedLimits = Field(default_factory=ResolvedLimits)
    subagents: list[ResolvedNode] = Field(default_factory=list)


class McpServerRef(BaseModel):
    """A remote MCP server of the agent (issue 13, item 4). ``headers`` hold references
    (``Bearer ${NAME}``), never secrets: the ``mcp_tool`` activity resolves them."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "name": "github",
                    "url": "https://mcp.example.com/mcp",
                    "headers": {"Authorization": "Bearer ${GITHUB_TOKEN}"},
                }
            ]
        }
    )

    name: str
    url: str
    headers: dict[str, str] = Field(default_factory=dict)


class McpToolSnapshot(BaseModel):
    """A tool discovered on an MCP server when the session loaded (so replay and retries
    see the same list): offered to the model as ``<server>.<name>``."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "server": "github",
                    "name": "search_issues",
                    "description": "Search issues.",
                    "input_schema": {"type": "object"},
                }
            ]
        }
    )

    server: str
    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=dict)
    error: str | None = Field(default=None, description="Discovery failed: why (no tools).")

    @property
    def qualified(self) -> str:
        """``<server>.<tool>``."""
        return f"{self.server}.{self.name}"


#: What separates an MCP tool's server from its name on the provider's wire: OpenAI and
#: Anthropic accept function names of ``[a-zA-Z0-9_-]`` only, so ``<server>.<tool>`` (the
#: name Baton stores, routes and audits) is offered as ``<server>__<tool>``.
WIRE_SEPARATOR = "__"


def wire_tool_name(name: str) -> str:
    """The name a provider sees for tool ``name``: dots become :data:`WIRE_SEPARATOR`.
    Baton's own tools have no dots, so only MCP tools (``<server>.<tool>``) change."""
    return name.replace(".", WIRE_SEPARATOR)


class ResolvedAgent(BaseModel):
    """The effective configuration of one published revision (``GET …/resolved``).

    ``inheritance`` lists the chain as pins, derived first (``["writer@2",
    "base@1"]``). ``tools`` is what the agent may actually use: declared tools
    of the whole chain, inside ``allowed_tools`` (when set), minus ``blocked_tools``.
    """

    model_config = ConfigDict(json_schema_extra={"examples": [{"slug": "writer", "version": 2}]})

    slug: str
    version: int
    digest: str
    name: str = ""
    description: str = ""
    system_prompt: str = ""
    model: str | None = None
    playbook: list[dict[str, Any]] | None = None
    skills: list[str] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    allowed_tools: list[str] | None = None
    blocked_tools: list[str] = Field(default_factory=list)
    limits: ResolvedLimits = Field(default_factory=ResolvedLimits)
    delegation: ResolvedDelegation = Field(default_factory=ResolvedDelegation)
    workspace_sharing: Literal["isolated", "shareable"] = "isolated"
    subagents: list[ResolvedNode] = Field(default_factory=list)
    inheritance: list[str] = Field(default_factory=list)
    #: issue 15: an ambassador only answers inquiries; it is never invoked or delegated to.
    kind: Literal["agent", "ambassador"] = "agent"
    mcp_servers: list[McpServerRef] = Field(default_factory=list, description="Issue 13.")
    mcp_tools: list[McpToolSnapshot] = Field(
        default_factory=list,
        description="Issue 13: the servers' tools as discovered at load (allowed/blocked "
        "narrowing applied), the snapshot the session runs with.",
    )

    @property
    def pin(self) -> str:
        """``slug@version``."""
        return f"{self.slug}@{self.version}"


def position(turn: int, step: int, kind: int, index: int = 0) -> str:
    """Sort key of a message: turn, model step, kind (0 user, 1 assistant, 2 tool, 3 error)."""
    return f"{turn:06d}.{step:03d}.{kind}{index:03d}"


#: Longest user message accepted (characters).
MAX_MESSAGE_CHARS = 64_000
#: ApplicationError types the send_message Update rejects or fails with.
SESSION_BUSY = "session_busy"
SESSION_CLOSED = "session_closed"
INVALID_PROMPT = "invalid_prompt"


SessionStatus = Literal["running", "idle", "awaiting_input", "cancelled", "failed"]
#: Statuses a session never leaves.
CLOSED_STATUSES = ("cancelled", "failed")


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
    external: bool = Field(
        default=False,
        description="Issue 13: an external session, whose turns an outside process takes "
        "(over MCP); no model turn runs in it.",
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
    # Issue 10 item 10: recovery after a worker loss. Timeouts travel in the input
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
    # Issue 10 item 6: token_budget reservations.
    max_output_tokens: int = Field(
        default=4096,
        description="Under a token_budget: the most output tokens one model call may "
        "reserve (its max_tokens; also capped to what the budget has left).",
    )
    # Issue 12 item 2: true state. A session's run ends once it has been idle this long
    # and its next message starts a new run of the same workflow id (baton.runs.launch).
    idle_timeout_s: float | None = Field(
        default=600.0,
        description="BATON_SESSION_IDLE_TIMEOUT: seconds an idle session's workflow waits "
        "for a message before it completes (None = never; runs from before it keep waiting).",
    )


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


class TeamMemberSnapshot(BaseModel):
    """A team member as a run sees it: slug, pin at launch, role, hint."""

    agent_id: str
    pin: str
    role: Literal["supervisor", "specialist"] = "specialist"
    hint: str = ""


class TeamSnapshot(BaseModel):
    """The team of a team run, fixed at launch (docs/teams.md)."""

    id: str
    supervisor: str
    members: list[TeamMemberSnapshot] = Field(default_factory=list)
    routes: list[tuple[str, str]] = Field(default_factory=list, description="(when, to)")
    shared_channel: str

    def specialists(self) -> list[TeamMemberSnapshot]:
        """Members other than the supervisor."""
        return [m for m in self.members if m.role == "specialist"]


# Issue 10, item 9: bounds of the review memory SessionInput carries (LateDecision below).
#: Decisions a session keeps for reviews that already had their outcome or that it does
#: not know (the newest; reported by Query ``late_decisions``).
MAX_LATE_DECISIONS = 50
#: Settled review ids a session remembers, to tell a decision that came too late from one
#: naming a review it never had; older ids read as ``unknown_review``.
MAX_SETTLED_REVIEWS = 200


#: The ``patch_level`` every new session run gets from its launcher and from its own
#: continue-as-new or idle completion (workflows/session_base.py ``BORN_PATCHED``).
SESSION_PATCH_LEVEL = 1


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
    patch_level: int = Field(
        default=0,
        description="The session workflow's patches this run was born with (issue 14): a "
        "run started at level 1 runs every patch of that level from its first command and "
        "records no patch marker for them. 0 (inputs from before the field): each patch is "
        "a `workflow.patched` marker, as before.",
    )


class ResumePoint(BaseModel):
    """``record_resume`` input, stored as ``sessions.resume_input``: where the next
    workflow run of a session whose run completed idle starts (issue 12, item 2)."""

    input: SessionInput = Field(description="The next run's input (the carried state).")
    task_queue: str = Field(description="The queue of the run that completed (and the next).")


class ToolCall(BaseModel):
    """A tool call the model made."""

    id: str
    name: str
    args: dict[str, Any] = Field(default_factory=dict)


class Usage(BaseModel):
    """Metered usage of one or more model calls."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    wall_ms: int = 0

    def __add__(self, other: Usage) -> Usage:
        cost = (
            None
            if self.cost_usd is None and other.cost_usd is None
            else (self.cost_usd or 0.0) + (other.cost_usd or 0.0)
        )
        return Usage(
            requests=self.requests + other.requests,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cost_usd=cost,
            wall_ms=self.wall_ms + other.wall_ms,
        )


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


# Issue 12, item 3: results that the Temporal UI shows (activity results, Update results)
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


class TurnOutcome(BaseModel):
    """``send_message`` result: the final assistant message, preview first (full text is in
    the DB)."""

    preview: str = ""
    preview_is_full: bool = False
    usage: Usage = Field(default_factory=Usage)
    message_id: str


#: Keyword search attributes (docs/operations.md, The run in the Temporal UI); registered
#: by the stack.
SA_AGENT = SearchAttributeKey.for_keyword("BatonAgent")
SA_VERSION = SearchAttributeKey.for_keyword("BatonAgentVersion")
SA_INVOKED_BY = SearchAttributeKey.for_keyword("BatonInvokedBy")
SA_STATUS = SearchAttributeKey.for_keyword("BatonStatus")
SA_USER = SearchAttributeKey.for_keyword("BatonUser")
SA_PARENT = SearchAttributeKey.for_keyword("BatonParentSession")
SA_TEAM = SearchAttributeKey.for_keyword("BatonTeam")
#: Issue 12, item 1: the root session of the run tree (a root session's own id; a step's
#: own id), on every session and step, so ``BatonRoot = "session-…"`` lists a whole run.
SA_ROOT = SearchAttributeKey.for_keyword("BatonRoot")
#: Issue 12, item 4: ``session`` | ``step``.
SA_KIND = SearchAttributeKey.for_keyword("BatonKind")
SEARCH_ATTRIBUTES = (
    SA_AGENT,
    SA_VERSION,
    SA_INVOKED_BY,
    SA_STATUS,
    SA_USER,
    SA_PARENT,
    SA_TEAM,
    SA_ROOT,
    SA_KIND,
)
WorkflowKind = Literal["session", "step"]


def _pinned_attributes(
    kind: WorkflowKind, pin: str, user: str, root: str
) -> list[SearchAttributePair[str]]:
    slug, _, version = pin.partition("@")
    return [
        SearchAttributePair(SA_KIND, kind),
        SearchAttributePair(SA_AGENT, slug),
        SearchAttributePair(SA_VERSION, version),
        SearchAttributePair(SA_USER, user),
        SearchAttributePair(SA_STATUS, "running"),
        SearchAttributePair(SA_ROOT, root),
    ]


def initial_search_attributes(inp: SessionInput) -> TypedSearchAttributes:
    """The search attributes a session starts with (set by whoever starts it): BatonKind
    ``session``, agent, version, user, status ``running``, BatonRoot (the run's root
    session, this one's id for a root), and when set BatonInvokedBy, BatonParentSession,
    BatonTeam."""
    root = inp.provenance.root_session_id or inp.session_id
    pairs = _pinned_attributes("session", inp.agent_pin, inp.provenance.created_by_user, root)
    for key, value in (
        (SA_INVOKED_BY, inp.provenance.invoked_by_agent),
        (SA_PARENT, inp.provenance.parent_session_id),
        (SA_TEAM, inp.provenance.team),
    ):
        if value:
            pairs.append(SearchAttributePair(key, value))
    return TypedSearchAttributes(pairs)


def step_search_attributes(inp: StepInput) -> TypedSearchAttributes:
    """The search attributes a step starts with (issue 12, item 4): BatonKind ``step``,
    agent, version (``inp.agent_pin`` must be a pin), user, status ``running`` and
    BatonRoot (the step's own id: a step is a tree of its own). The step workflow keeps
    BatonStatus up to date (running | awaiting_handoff | completed | failed | rejected)."""
    return TypedSearchAttributes(_pinned_attributes("step", inp.agent_pin, inp.user, inp.step_id))


# --- X-Agent tools (Gamut X-Agent) -------------------------------------------------

#: Policy-controlled operations (Gamut X-Agent Policies, 'Operations'); create always reviews.
Operation = Literal["list", "read", "invoke", "create"]
OPERATION_OF: dict[str, Operation] = {
    "list_agents": "list",
    "create_agent": "create",
    "invoke_agent": "invoke",
    "get_agent_sessions": "read",
    "get_agent_session_transcript": "read",
}
XAGENT_TOOLS = tuple(OPERATION_OF)
#: Guard refusal codes (docs/xagent.md), returned to the model in the tool error.
SELF_INVOCATION = "self_invocation"
SELF_DELEGATION = "self_delegation"
ONE_HOP_VIOLATION = "one_hop_violation"
BLOCKED_BY_POLICY = "blocked_by_policy"
#: Every path by which one agent makes another run (the audit log's ``via``).
Via = Literal["invoke", "delegate_to", "route", "mention", "task"]


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


SLUG_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
SESSION_ID_PATTERN = r"^session-[0-9a-f-]{36}$"


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


def check_text(value: str) -> str:
    """Refuse NUL characters and unpaired surrogates (PostgreSQL and UTF-8 cannot store them)."""
    if "\x00" in value:
        raise ValueError("text must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("text must be valid Unicode (no unpaired surrogates)") from exc
    return value


#: Text the database can store (agent specs, API bodies and tool arguments alike).
SafeText = Annotated[str, AfterValidator(check_text)]
Task = Annotated[str, AfterValidator(check_text), AfterValidator(_not_blank)]


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ListAgentsArgs(_Args):
    """``list_agents()``: no parameters."""


class CreateAgentArgs(_Args):
    """``create_agent(name, description?, instructions?)``."""

    name: SafeText = Field(
        min_length=1, max_length=200, description="Display name of the new agent."
    )
    description: SafeText | None = Field(
        default=None, max_length=2000, description="One-line description."
    )
    instructions: SafeText | None = Field(
        default=None, max_length=100_000, description="The new agent's system prompt."
    )


class InvokeAgentArgs(_Args):
    """``invoke_agent(slug, prompt, session_id?, sync=false)``."""

    slug: str = Field(pattern=SLUG_PATTERN, description="Target agent's slug (from list_agents).")
    prompt: Task = Field(min_length=1, max_length=MAX_MESSAGE_CHARS, description="The message.")
    session_id: str | None = Field(
        default=None,
        pattern=SESSION_ID_PATTERN,
        description="An existing session of the target to continue; it must not be running.",
    )
    sync: bool = Field(
        default=False,
        description="true: wait for the target's turn and return its final message inline; "
        "false: return at once with status running.",
    )


class GetAgentSessionsArgs(_Args):
    """``get_agent_sessions(slug, limit=50, offset=0)``."""

    slug: str = Field(pattern=SLUG_PATTERN)
    limit: int = Field(default=50, ge=1, le=200)
    offset: int = Field(default=0, ge=0, le=1_000_000)


class GetTranscriptArgs(_Args):
    """``get_agent_session_transcript(slug, session_id, sync=false)``."""

    slug: str = Field(pattern=SLUG_PATTERN)
    session_id: str = Field(pattern=SESSION_ID_PATTERN)
    sync: bool = Field(
        default=False, description="Wait for a running session's turn to finish first."
    )


XAGENT_ARGS: dict[str, type[_Args]] = {
    "list_agents": ListAgentsArgs,
    "create_agent": CreateAgentArgs,
    "invoke_agent": InvokeAgentArgs,
    "get_agent_sessions": GetAgentSessionsArgs,
    "get_agent_session_transcript": GetTranscriptArgs,
}


class ToolMessage(BaseModel):
    """Where a tool call's result is stored: the session, message id and position."""

    session_id: str
    agent_slug: str
    message_id: str
    position: str
    call: ToolCall


ReviewOutcome = Literal["allowed", "denied", "timed_out"]
Decision = Literal["deny", "allow_once", "always_allow"]


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
    proof: str | None = Field(
        default=None,
        max_length=128,
        description="HMAC-SHA256 (hex) the API or the worker adds "
        "(baton.permissions.reviews.prove); "
        "a decision without a valid one is recorded as 'temporal (unverified)'.",
    )


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


class AuthorizeResult(BaseModel):
    """``allow`` proceeds, ``review`` waits for a decision, ``refused`` is final."""

    decision: Literal["allow", "review", "refused"]
    outcome: ToolOutcome | None = None


class XAgentCall(BaseModel):
    """``xagent_tool`` activity input: list / create / read operations, after policy."""

    tool: ToolMessage
    user: str
    auth: bool = False


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
        "the decision and the stored tool result, not two (issue 14).",
    )


class SettleResult(BaseModel):
    """Whether the operation may proceed; the refusal's tool result when it may not, and
    the result of ``SettleInput.then`` when it ran."""

    allowed: bool
    outcome: ToolOutcome | None = None
    ran: ToolOutcome | None = None


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


# --- Delegation (AgentX Agent Teams delegate_to, Xema Agent Concepts subagent task) ---------------

#: Namespace of delegated session ids (uuid5 of the delegation id: stable across retries).
DELEGATION_NS = uuid.UUID("5f0f3c6e-7b1a-4d0e-9a55-0b8a7c1d2e3f")


def delegated_session_id(delegation_id: str) -> str:
    """The id of the session a delegation starts (``session-<uuid5>``): derived from the
    delegation id, so a retried ``delegate`` attaches to what its first attempt started,
    and the caller's workflow can name the child in its activity summary. Pure."""
    return f"session-{uuid.uuid5(DELEGATION_NS, delegation_id)}"


DELEGATION_TOOLS = ("delegate_to", "task")
LIMIT_EXCEEDED = "limit_exceeded"
BALANCE_EXHAUSTED = "balance_exhausted"


class DelegateToArgs(_Args):
    """``delegate_to(agent_id, task)``."""

    agent_id: str = Field(pattern=SLUG_PATTERN, description="The teammate to hand the task to.")
    task: Task = Field(
        min_length=1,
        max_length=MAX_MESSAGE_CHARS,
        description="A self-contained task with all the context the teammate needs.",
    )


class TaskArgs(_Args):
    """``task(alias, prompt)``: run a subagent of this agent's tree."""

    alias: str = Field(pattern=SLUG_PATTERN, description="The subagent's alias.")
    prompt: Task = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)


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


# --- Workflow-agent steps (issue 6; Xema Agent Concepts 'One Agent, two execution experiences') ---

StepStatus = Literal["running", "awaiting_handoff", "completed", "failed", "rejected"]
STEP_CLOSED = ("completed", "failed", "rejected")
INVALID_DELIVERABLE = "invalid_deliverable"
#: Issue 12, item 4: the ApplicationError type a step's workflow fails with when the step
#: ends ``failed`` or ``rejected`` (so the Temporal UI lists it under ExecutionStatus =
#: "Failed"); the step row keeps the status and error the API reports.
HANDOFF_TIMEOUT = "handoff_timeout"
STEP_TIMEOUT = "step_timeout"
STEP_REJECTED = "step_rejected"
TOO_MANY_ATTEMPTS = "too_many_attempts"
ATTEMPT_FAILED = "attempt_failed"


class StepRetry(BaseModel):
    """Attempts of a step: invalid deliverables and failed model calls are retried."""

    model_config = ConfigDict(
        extra="forbid",
        # POST /v1/steps takes it as is: `true` or `"3"` is refused, never coerced (issue 10,
        # item 11). Decoding old histories is unaffected: JSON numbers stay numbers.
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


class StepUpdate(BaseModel):
    """``update_step`` activity input: the step row's new state."""

    step_id: str
    status: StepStatus
    attempts: int = 0
    deliverable: Any = None
    error: str | None = None


class DeliverableCheck(BaseModel):
    """``check_deliverable`` activity input: the final message and the schema (or none)."""

    step_id: str
    message_id: str
    output_schema: dict[str, Any] | None = None


class DeliverableResult(BaseModel):
    """The parsed deliverable, or the validation errors to feed back to the model."""

    ok: bool
    deliverable: Any = None
    errors: list[str] = Field(default_factory=list)


# --- Issue 10, item 9: late decisions, carried across continue-as-new -----------------


class LateDecision(BaseModel):
    """A ``review_decision`` Signal that changed nothing (Query ``late_decisions``).

    ``too_late``: the review had its outcome (a decision or the timeout) already;
    ``unknown_review``: no review of this session has that id (or it was settled
    more than :data:`MAX_SETTLED_REVIEWS` reviews ago).
    """

    review_id: str = Field(max_length=80)
    decision: Decision
    reason: Literal["too_late", "unknown_review"]


SessionInput.model_rebuild()
# --- Inquiries (issue 15: the ambassador, AgentX Agent Teams) -------------------------------------


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


class InquiryResult(BaseModel):
    """What the Inquiry workflow returns: the stored status (answer text stays in the DB)."""

    inquiry_id: str
    status: Literal["answered", "failed"]
    steps: int = 0


# --- Agents outside Baton: external sessions over MCP (issue 13, docs/mcp.md) ----------

#: Update names on SessionWorkflow (stable once shipped).
EXTERNAL_TOOL_CALL = "external_tool_call"
EXTERNAL_MESSAGE = "external_message"
#: ApplicationError type: send_message on an external session (no model turn runs there).
SESSION_EXTERNAL = "session_external"
#: ApplicationError type: an external Update on a session that is not external.
NOT_EXTERNAL = "not_external"
#: ApplicationError type: an external tool call naming anything but the five X-Agent tools.
UNKNOWN_TOOL = "unknown_tool"


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


class ExternalMessageInput(BaseModel):
    """``record_external_message`` activity input: the id and position the workflow chose."""

    session_id: str
    agent_slug: str
    message_id: str
    position: str
    role: Literal["user", "assistant"]
    text: str


class ExternalMessageOutcome(BaseModel):
    """``external_message`` result: the stored message's id."""

    message_id: str


class McpToolInput(BaseModel):
    """``mcp_tool`` activity input: one ``<server>.<tool>`` call of the model (issue 13)."""

    tool: ToolMessage
    server: McpServerRef
    name: str
    input_schema: dict[str, Any] = Field(default_factory=dict)
