"""The authored agent spec (what ``PUT /v1/agents/{slug}/draft`` and ``baton apply`` take).

Pure pydantic, no I/O: safe to import from workflow code. Unknown fields are
errors (``extra="forbid"``); the removed ``maxFanout`` / ``max_fanout`` field is
refused with its own error type ``removed_field`` (Xema Agent Concepts, 'What bounds a
tree': "a manifest declaring it is now rejected").

Shape bounds that need only the spec itself (tree depth and size, sibling
aliases) are checked by :func:`check_tree_shape`; bounds that need other agents
(``extends`` chains, references) by :mod:`baton.agents.layers`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Annotated, Any, Literal

import regex
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from baton import saferegex
from baton.contracts.evals import PublishGate
from baton.contracts.text import SafeText as SafeText  # re-exported: specs and API bodies use it
from baton.contracts.text import check_text
from baton.errors import DuplicateAlias, TreeTooDeep, TreeTooLarge

SLUG_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
REF_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}(@[1-9][0-9]{0,8})?$"
TOOL_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"

#: Fixed platform bounds (Xema Agent Concepts, 'What bounds a tree'); not per-agent settings.
MAX_TREE_LEVELS = 6
MAX_TREE_NODES = 64
MAX_INHERITANCE_LINKS = 32

#: Field names that were removed from the contract and are refused where they appear.
REMOVED_FIELDS = frozenset({"maxFanout", "max_fanout"})

Slug = Annotated[str, Field(pattern=SLUG_PATTERN, examples=["researcher"])]
AgentRef = Annotated[
    str,
    Field(
        pattern=REF_PATTERN,
        description="`slug` (the live revision) or `slug@version` (that revision).",
        examples=["researcher", "researcher@3"],
    ),
]
ToolName = Annotated[str, Field(pattern=TOOL_PATTERN, examples=["web_search"])]
SkillName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")]
ModelName = Annotated[
    str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,199}$", examples=["openai:gpt-4o-mini"])
]


MAX_PROMPT_CHARS = 100_000
MAX_LIST_ITEMS = 256
MAX_PLAYBOOK_RULES = 200
MAX_PATTERN_CHARS = 500
MAX_ARGS_DEPTH = 16
MAX_ARGS_JSON_CHARS = 16_000
#: Run-time bound on one playbook pattern match (seconds); a pathological pattern
#: simply does not match rather than stalling a model turn.
PATTERN_TIMEOUT_S = 0.05


def _check_json_value(value: Any, depth: int = 0) -> None:
    if depth > MAX_ARGS_DEPTH:
        raise ValueError(f"nested deeper than {MAX_ARGS_DEPTH} levels")
    if isinstance(value, str):
        check_text(value)
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError("numbers must be finite (no NaN or Infinity)")
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(str(key))
            _check_json_value(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_json_value(item, depth + 1)


def compile_pattern(pattern: str) -> regex.Pattern[str]:
    """Compile a playbook or route ``when`` pattern (case-insensitive, cached).

    Raises ValueError for an invalid pattern or one that expands past
    :data:`baton.saferegex.MAX_EXPANDED_SIZE`.
    """
    return saferegex.compile_user_pattern(pattern, regex.IGNORECASE)


def pattern_matches(pattern: str, text: str, timeout: float = PATTERN_TIMEOUT_S) -> bool:
    """Search ``pattern`` (case-insensitive) in ``text`` with a time limit; a timeout or a
    refused pattern counts as no match (see :func:`baton.saferegex.search`)."""
    try:
        return saferegex.search(pattern, text, timeout=timeout, flags=regex.IGNORECASE)
    except (saferegex.PatternTimeout, ValueError):
        return False


def _refuse_removed(data: Any) -> Any:
    if isinstance(data, dict):
        for key in data:
            if key in REMOVED_FIELDS:
                raise PydanticCustomError(
                    "removed_field",
                    "'{field}' was removed from the agent contract on 2026-09-01; delete it",
                    {"field": key},
                )
    return data


class _Strict(BaseModel):
    """Unknown fields are errors, removed fields get their own error type, and values are
    not coerced (``"max_spawns": true`` or ``"4"`` is refused)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _no_removed_fields(cls, data: Any) -> Any:
        return _refuse_removed(data)


class PlaybookToolCall(_Strict):
    """A tool call the scripted model makes: ``{tool, args}``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"tool": "invoke_agent", "args": {"slug": "writer", "prompt": "Draft it"}}]
        },
    )

    tool: SafeText = Field(min_length=1, max_length=64, examples=["invoke_agent"])
    args: dict[str, Any] = Field(default_factory=dict, examples=[{"slug": "writer"}])

    @field_validator("args")
    @classmethod
    def _bounded_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        _check_json_value(value)
        if len(json.dumps(value)) > MAX_ARGS_JSON_CHARS:
            raise ValueError(f"args must serialise to at most {MAX_ARGS_JSON_CHARS} characters")
        return value


class PlaybookRule(_Strict):
    """One rule of the scripted model's playbook: when ``when`` matches, answer.

    ``when`` is a regular expression searched (case-insensitive) in the last
    message (a tool result reads ``<tool>: <output>``); omitted = always matches.
    A rule answers with ``reply`` text and/or ``tool_calls``; at least one is
    required. ``{last_message}`` in ``reply`` or in string ``args`` is replaced by
    the last message's text (a tool result's raw output, without the label).
    """

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "when": "(?i)report",
                    "reply": "Delegating to the writer.",
                    "tool_calls": [
                        {"tool": "invoke_agent", "args": {"slug": "writer", "prompt": "Draft it"}}
                    ],
                }
            ]
        },
    )

    when: SafeText | None = Field(
        default=None, max_length=MAX_PATTERN_CHARS, examples=["summari[sz]e"]
    )
    reply: SafeText | None = Field(
        default=None, max_length=MAX_PROMPT_CHARS, examples=["Here is the summary."]
    )
    tool_calls: list[PlaybookToolCall] = Field(default_factory=list, max_length=16)
    chunk_delay_ms: int = Field(
        default=0, ge=0, le=5000, description="Pause between streamed words (demos, tests)."
    )

    @field_validator("when")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            compile_pattern(value)
        return value

    @model_validator(mode="after")
    def _answers(self) -> PlaybookRule:
        if self.reply is None and not self.tool_calls:
            raise ValueError("a playbook rule needs 'reply' or 'tool_calls'")
        return self


class AgentLimits(_Strict):
    """Run-time limits, enforced by Baton (unlike Xema Agent Concepts, where they are declarative).

    Unset (null) bounds nothing. An overlay can only lower a limit.
    """

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"max_depth": 2, "max_spawns": 6, "token_budget": 100000}]},
    )

    max_depth: int | None = Field(
        default=None, ge=0, le=64, description="Delegation nesting allowed below this agent."
    )
    max_spawns: int | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="Sessions one run of this agent may start in total.",
    )
    token_budget: int | None = Field(
        default=None,
        ge=1,
        le=10**12,
        description="Tokens (in + out) across the run's whole subtree.",
    )


class DelegationConfig(_Strict):
    """Ad-hoc delegation roster membership (AgentX Agent Teams, 'Ad-hoc delegation')."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"available_for_delegation": True, "delegation_hint": "verifies claims"}]
        },
    )

    available_for_delegation: bool | None = Field(
        default=None, description="Offer this agent on other agents' roster (default false)."
    )
    delegation_hint: SafeText | None = Field(
        default=None, max_length=500, description="Specialty shown on the roster."
    )


class SubagentNode(_Strict):
    """A node of a subagent tree: a reference to another agent plus node-local narrowing."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "alias": "checker",
                    "agent": "fact-checker@2",
                    "instructions": "Be strict.",
                    "allowed_tools": ["web_search"],
                }
            ]
        },
    )

    alias: Slug = Field(description="Name of this node, distinct among its siblings.")
    agent: AgentRef
    instructions: SafeText | None = Field(
        default=None,
        max_length=MAX_PROMPT_CHARS,
        description="Appended to the referenced agent's prompt for this node.",
    )
    model: ModelName | None = Field(default=None, description="Model override for this node.")
    allowed_tools: list[ToolName] | None = Field(
        default=None,
        max_length=MAX_LIST_ITEMS,
        description="Narrows the referenced agent's tools; null = no narrowing.",
    )
    subagents: list[SubagentNode] = Field(default_factory=list, max_length=MAX_TREE_NODES + 1)


#: A header value names its secret, never holds it: an optional scheme
#: word, then ``${NAME}`` — an environment variable (or a ``BATON_…`` setting) of the worker.
MCP_HEADER_VALUE = r"^(?:[A-Za-z][A-Za-z0-9-]{0,31} )?\$\{[A-Z][A-Z0-9_]{0,127}\}$"
MAX_MCP_SERVERS = 8


class McpServerSpec(_Strict):
    """A remote MCP server (streamable HTTP) whose tools the agent may call as
    ``<name>.<tool>``. Header values reference secrets by name."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "github",
                    "url": "https://mcp.example.com/mcp",
                    "headers": {"Authorization": "Bearer ${GITHUB_TOKEN}"},
                }
            ]
        },
    )

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,30}$", description="Prefix of its tools.")
    url: str = Field(pattern=r"^https?://[^\s]{1,2000}$", max_length=2008)
    headers: dict[
        Annotated[str, Field(pattern=r"^[A-Za-z0-9-]{1,64}$")],
        Annotated[str, Field(pattern=MCP_HEADER_VALUE)],
    ] = Field(default_factory=dict, max_length=16)


class AgentSpec(_Strict):
    """The versioned part of an agent (docs/agents.md). All fields are optional.

    ``tools`` declares tools; ``allowed_tools`` (null = no envelope) and
    ``blocked_tools`` bound what may be used. See docs/agents.md, 'Resolution rules'.
    """

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "system_prompt": "You research questions and cite sources.",
                    "extends": "base-assistant",
                    "prompt_mode": "append",
                    "tools": ["web_search"],
                    "limits": {"max_spawns": 4, "token_budget": 50000},
                    "subagents": [{"alias": "checker", "agent": "fact-checker@2"}],
                }
            ]
        },
    )

    system_prompt: SafeText | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    extends: AgentRef | None = Field(default=None, description="Base agent to inherit from.")
    prompt_mode: Literal["append", "replace"] = Field(
        default="append",
        description="append: base prompt then this one; replace: this prompt only.",
    )
    model: ModelName | None = Field(
        default=None, examples=["openai:gpt-4o-mini"], description="pydantic-ai model name."
    )
    playbook: list[PlaybookRule] | None = Field(
        default=None,
        max_length=MAX_PLAYBOOK_RULES,
        description="Rules for the offline scripted model; ignored by real models.",
    )
    skills: list[SkillName] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)
    tools: list[ToolName] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)
    allowed_tools: list[ToolName] | None = Field(default=None, max_length=MAX_LIST_ITEMS)
    blocked_tools: list[ToolName] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)
    subagents: list[SubagentNode] = Field(default_factory=list, max_length=MAX_TREE_NODES + 1)
    limits: AgentLimits = Field(default_factory=AgentLimits)
    delegation: DelegationConfig = Field(default_factory=DelegationConfig)
    workspace_sharing: Literal["isolated", "shareable"] | None = None
    kind: Literal["agent", "ambassador"] | None = Field(
        default=None,
        description="agent (default) or ambassador: a relay that briefs a person on a "
        "session and never enters it (AgentX Agent Teams, 'Ambassador'); null = inherited.",
    )
    mcp_servers: list[McpServerSpec] = Field(
        default_factory=list,
        max_length=MAX_MCP_SERVERS,
        description="Remote MCP servers; their tools are offered as <server>.<tool>.",
    )
    publish_gate: PublishGate | None = Field(
        default=None,
        description="What an eval of the draft must show before it is published "
        "(docs/change-safely.md, 'The publish gate'); the nearest layer of the extends "
        "chain that sets it wins; null = inherited, else BATON_PUBLISH_GATE.",
    )

    @field_validator("mcp_servers")
    @classmethod
    def _distinct_servers(cls, servers: list[McpServerSpec]) -> list[McpServerSpec]:
        names = [m.name for m in servers]
        if len(set(names)) != len(names):
            raise ValueError("mcp_servers names must be distinct")
        return servers

    def references(self) -> list[str]:
        """Every agent reference in the spec: ``extends`` first, then the tree in pre-order."""
        refs = [self.extends] if self.extends else []
        refs.extend(node.agent for node, _path, _level in iter_tree(with_paths(self.subagents)))
        return refs


def iter_tree(
    top: list[tuple[SubagentNode, str]], level: int = 1
) -> list[tuple[SubagentNode, str, int]]:
    """Nodes of a tree in pre-order as ``(node, path, level)``; top-level nodes are level 1.

    ``top`` pairs each top-level node with its path (e.g. ``subagents[0]``).
    """
    out: list[tuple[SubagentNode, str, int]] = []
    for node, node_path in top:
        out.append((node, node_path, level))
        out.extend(iter_tree(child_paths(node, node_path), level + 1))
    return out


def child_paths(node: SubagentNode, node_path: str) -> list[tuple[SubagentNode, str]]:
    """``node``'s children paired with their paths."""
    return [(c, f"{node_path}.subagents[{i}]") for i, c in enumerate(node.subagents)]


def with_paths(
    nodes: list[SubagentNode], path: str = "subagents"
) -> list[tuple[SubagentNode, str]]:
    """Top-level ``nodes`` paired with their paths under ``path``."""
    return [(node, f"{path}[{i}]") for i, node in enumerate(nodes)]


def check_tree_shape(top: list[tuple[SubagentNode, str]]) -> None:
    """Enforce the fixed tree bounds (Xema Agent Concepts, 'What bounds a tree').

    ``top`` is the top-level nodes with their paths (see :func:`with_paths`).
    At most ``MAX_TREE_LEVELS`` (6) levels of nesting (a top-level subagent is
    level 1), at most ``MAX_TREE_NODES`` (64) nodes in total, distinct aliases
    among siblings. Raises ``TreeTooDeep``, ``TreeTooLarge`` or ``DuplicateAlias``
    with the path of the first offending node.
    """
    flat = iter_tree(top)
    for node, node_path, level in flat:
        if level > MAX_TREE_LEVELS:
            raise TreeTooDeep(
                f"subagent tree is {level} levels deep at '{node.alias}'; "
                f"at most {MAX_TREE_LEVELS} are allowed",
                path=node_path,
            )
    if len(flat) > MAX_TREE_NODES:
        _node, node_path, _level = flat[MAX_TREE_NODES]
        raise TreeTooLarge(
            f"subagent tree has {len(flat)} nodes; at most {MAX_TREE_NODES} are allowed",
            path=node_path,
        )
    _check_sibling_aliases(top)
    for node, node_path, _level in flat:
        _check_sibling_aliases(child_paths(node, node_path))


def _check_sibling_aliases(siblings: list[tuple[SubagentNode, str]]) -> None:
    seen: set[str] = set()
    for node, node_path in siblings:
        if node.alias in seen:
            raise DuplicateAlias(
                f"alias '{node.alias}' is used by more than one sibling",
                path=f"{node_path}.alias",
            )
        seen.add(node.alias)


def canonical_json(spec: AgentSpec) -> str:
    """The canonical JSON of a spec: defaults omitted, keys sorted, no whitespace."""
    data = spec.model_dump(mode="json", exclude_defaults=True)
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def spec_digest(spec: AgentSpec) -> str:
    """``sha256:<hex>`` of :func:`canonical_json` (docs/agents.md, content-addressed revisions)."""
    return "sha256:" + hashlib.sha256(canonical_json(spec).encode()).hexdigest()


def parse_ref(ref: str) -> tuple[str, int | None]:
    """Split ``slug`` / ``slug@3`` into ``(slug, version or None)``.

    Raises ``ValueError`` when ``ref`` does not match ``REF_PATTERN``.
    """
    if not re.fullmatch(REF_PATTERN, ref):
        raise ValueError(f"'{ref}' is not an agent reference (slug or slug@version)")
    slug, _, version = ref.partition("@")
    return slug, int(version) if version else None
