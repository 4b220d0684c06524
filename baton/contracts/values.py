"""Value types shared by both sides of the Temporal boundary: the resolved agent, the
team snapshot, tool calls, usage, and the literal sets (statuses, operations, paths).

Sandbox-safe: no I/O, no settings, no SQLModel tables. New fields always have defaults
so histories recorded by older code still decode.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


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
    """A remote MCP server of the agent (docs/mcp.md). ``headers`` hold references
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
    #: An ambassador only answers inquiries; it is never invoked or delegated to.
    kind: Literal["agent", "ambassador"] = "agent"
    mcp_servers: list[McpServerRef] = Field(
        default_factory=list, description="Remote MCP servers the agent uses (docs/mcp.md)."
    )
    mcp_tools: list[McpToolSnapshot] = Field(
        default_factory=list,
        description="The servers' tools as discovered at load (allowed/blocked "
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


SessionStatus = Literal["running", "idle", "awaiting_input", "cancelled", "failed"]
#: Statuses a session never leaves.
CLOSED_STATUSES = ("cancelled", "failed")


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


# X-Agent tools (Gamut X-Agent).

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
#: Every path by which one agent makes another run (the audit log's ``via``).
Via = Literal["invoke", "delegate_to", "route", "mention", "task"]


ReviewOutcome = Literal["allowed", "denied", "timed_out", "withdrawn"]
Decision = Literal["deny", "allow_once", "always_allow"]


# Delegation (AgentX Agent Teams delegate_to, Xema Agent Concepts subagent task).

#: Namespace of delegated session ids (uuid5 of the delegation id: stable across retries).
DELEGATION_NS = uuid.UUID("5f0f3c6e-7b1a-4d0e-9a55-0b8a7c1d2e3f")


def delegated_session_id(delegation_id: str) -> str:
    """The id of the session a delegation starts (``session-<uuid5>``): derived from the
    delegation id, so a retried ``delegate`` attaches to what its first attempt started,
    and the caller's workflow can name the child in its activity summary. Pure."""
    return f"session-{uuid.uuid5(DELEGATION_NS, delegation_id)}"


DELEGATION_TOOLS = ("delegate_to", "task")


# Workflow-agent steps (Xema Agent Concepts, 'One Agent, two execution experiences').

StepStatus = Literal["running", "awaiting_handoff", "completed", "failed", "rejected"]
STEP_CLOSED = ("completed", "failed", "rejected")


class DeliveryConfig(BaseModel):
    """How a webhook delivery is attempted (``BATON_WEBHOOK_*``; workflows read no settings):
    each POST bounded by ``timeout_s``, up to ``max_attempts`` in all, the first retry after
    ``retry_initial_s`` seconds, each next one twice as late, never more than
    ``retry_max_s`` apart. ``public_url``: the base of the links a payload carries."""

    timeout_s: float = 10.0
    max_attempts: int = 10
    retry_initial_s: float = 2.0
    retry_max_s: float = 900.0
    public_url: str = "http://127.0.0.1:8000"


class ExhibitLimits(BaseModel):
    """What one exhibit may hold (``BATON_EXHIBIT_*``; docs/exhibits.md, 'Limits'):
    ``max_bytes`` of decoded content (image, download), ``max_inline_chars`` of a chart
    spec's JSON or a markdown text, a table's ``max_columns`` and ``max_rows``, and
    ``max_cell_chars`` per cell."""

    max_bytes: int = 2 * 1024 * 1024
    max_inline_chars: int = 64_000
    max_columns: int = 50
    max_rows: int = 500
    max_cell_chars: int = 2_000
