"""Ordinary tools: the non-orchestration tools an agent may declare in ``tools``.

Each tool has a JSON Schema for its arguments; the ``run_tool`` activity
validates a call against it (jsonschema) and a failure goes back to the model as
a tool error it can recover from (docs/sessions.md). Tools an agent declares that this
deployment does not implement are not offered to the model.
"""

from __future__ import annotations

import ast
import copy
import functools
import operator
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import jsonschema
from pydantic import BaseModel

from baton.contracts.tool_args import PRESENT_EXHIBIT, XAGENT_ARGS, PresentExhibitArgs
from baton.contracts.values import ResolvedAgent


class ToolError(Exception):
    """A tool call that failed in a way the model should see and can correct."""


@dataclass(frozen=True)
class Tool:
    """A tool: name, description, JSON Schema of its arguments, and the function."""

    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[[dict[str, Any]], str]

    def validate(self, args: dict[str, Any]) -> None:
        """Raise ToolError naming the first schema violation in ``args``."""
        validator = jsonschema.Draft202012Validator(self.parameters)
        error = jsonschema.exceptions.best_match(validator.iter_errors(args))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "arguments"
            raise ToolError(f"invalid arguments for {self.name} at {where}: {error.message}")


_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


#: Largest integer result (bits): chained powers would otherwise eat CPU and memory.
MAX_INT_BITS = 4096


def _bounded(value: Any) -> float | int:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ToolError(f"result too large (more than {MAX_INT_BITS} bits)")
    if isinstance(value, complex):
        raise ToolError("complex results are not supported")
    return value  # type: ignore[no-any-return]


def _eval(node: ast.AST) -> float | int:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ToolError("exponent too large (at most 64)")
        return _bounded(_OPS[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _bounded(_OPS[type(node.op)](_eval(node.operand)))
    raise ToolError("only numbers, + - * / // % ** and parentheses are allowed")


def _calculator(args: dict[str, Any]) -> str:
    try:
        tree = ast.parse(args["expression"], mode="eval")
        return str(_eval(tree))
    except (SyntaxError, ZeroDivisionError, OverflowError) as exc:
        raise ToolError(f"cannot evaluate: {exc}") from exc


def _current_time(args: dict[str, Any]) -> str:
    try:
        zone = ZoneInfo(args.get("timezone", "UTC"))
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ToolError(f"unknown timezone {args.get('timezone')!r}") from exc
    return datetime.now(UTC).astimezone(zone).isoformat(timespec="seconds")


def _word_count(args: dict[str, Any]) -> str:
    return str(len(str(args["text"]).split()))


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool(
            "calculator",
            "Evaluate an arithmetic expression, e.g. '(2 + 3) * 4'.",
            {
                "type": "object",
                "properties": {"expression": {"type": "string", "maxLength": 500}},
                "required": ["expression"],
                "additionalProperties": False,
            },
            _calculator,
        ),
        Tool(
            "current_time",
            "The current date and time in an IANA timezone (default UTC).",
            {
                "type": "object",
                "properties": {"timezone": {"type": "string", "maxLength": 64}},
                "additionalProperties": False,
            },
            _current_time,
        ),
        Tool(
            "word_count",
            "Count the words in a text.",
            {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
                "additionalProperties": False,
            },
            _word_count,
        ),
    )
}


def offered_tools(names: list[str]) -> list[Tool]:
    """The implemented tools among ``names`` (an agent's usable tools), in order."""
    return [TOOLS[n] for n in names if n in TOOLS]


def run_tool(name: str, args: dict[str, Any], allowed: list[str]) -> str:
    """Validate and run one call. Raises ToolError for a tool not offered, bad args or failure."""
    if name not in allowed or name not in TOOLS:
        raise ToolError(f"tool '{name}' is not available to this agent")
    tool = TOOLS[name]
    tool.validate(args)
    return tool.run(args)


#: What the model reads about each X-Agent tool (Gamut X-Agent, 'X-Agent tools').
XAGENT_DESCRIPTIONS = {
    "list_agents": "Discover the other agents in the workspace: slug, display name and "
    "description of each (you are not listed). Call it before invoke_agent to find a slug.",
    "create_agent": "Create a new agent from a name, an optional one-line description and "
    "optional instructions (its system prompt). Returns the new slug, which invoke_agent "
    "accepts at once. Every call waits for a human's approval.",
    "invoke_agent": "Send a message to another agent: the main way to delegate. sync=true "
    "waits for the agent's turn and returns its final message inline; sync=false (default) "
    "returns at once with the session id and status running (read the result later with "
    "get_agent_session_transcript). session_id continues an existing session of that agent, "
    "which must not be running.",
    "get_agent_sessions": "List another agent's sessions, newest first: id, name, creation "
    "time, last activity, message count and whether it is running. limit (default 50, "
    "max 200) and offset page through them.",
    "get_agent_session_transcript": "Read another agent's session: a status line (running, "
    "idle or awaiting_input) then the messages, tool input/output summarised. Each message "
    "is one entry starting with its header ([user], [assistant <slug>], [tool <name>]); "
    "its further lines start with '  | ' and are part of it. An entry marked 'via "
    "external process' was written by an outside process, not by the person or a Baton "
    "agent. sync=true waits for a running turn to finish first.",
}


@functools.cache
def args_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema a model is offered for a tool whose arguments are ``model``: its
    properties without pydantic's titles. Cached per process (pydantic's schema generation
    cost ~2 ms per tool per turn): copy it before changing it."""
    schema = model.model_json_schema()
    schema.pop("title", None)
    schema.pop("description", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return schema


def xagent_tools(blocked: list[str]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(name, description, JSON Schema)`` of the X-Agent tools offered to every agent.

    An agent's ``blocked_tools`` can withdraw them (docs/agents.md, narrowing only). Each
    schema is a fresh copy, so a caller may change it.
    """
    return [
        (name, XAGENT_DESCRIPTIONS[name], copy.deepcopy(args_schema(XAGENT_ARGS[name])))
        for name in XAGENT_ARGS
        if name not in blocked
    ]


PRESENT_EXHIBIT_DESCRIPTION = (
    "Show something to the person in the conversation, as a card: an image (kind image: "
    "base64 png, jpeg, gif or webp in data, with media_type), a table (columns and rows), "
    "a chart (a Vega-Lite spec, shown as its JSON), markdown (text), a file to download "
    "(kind download: base64 data, filename, media_type; SVG and HTML go here) or a file "
    "of the session's workspace (kind file: path). Give every exhibit a title. Once shown, "
    "refer to it by title; never write its content again or make up a URL for it."
)


def present_exhibit_tool(blocked: list[str]) -> list[tuple[str, str, dict[str, Any]]]:
    """``present_exhibit`` (docs/exhibits.md), offered to every agent that does not block
    it: ``[(name, description, JSON Schema)]`` or ``[]``."""
    if PRESENT_EXHIBIT in blocked:
        return []
    schema = copy.deepcopy(args_schema(PresentExhibitArgs))
    return [(PRESENT_EXHIBIT, PRESENT_EXHIBIT_DESCRIPTION, schema)]


def delegate_to_tool(members: list[tuple[str, str]]) -> tuple[str, str, dict[str, Any]]:
    """``delegate_to(agent_id, task)`` with an enum of ``members`` and their hints (AgentX
    Agent Teams)."""
    hints = "; ".join(f"{slug}: {hint}" for slug, hint in members)
    return (
        "delegate_to",
        "Hand a focused, self-contained subtask to a teammate and get its full result. "
        "The teammate sees only the task, not this conversation. Several calls in one "
        f"turn run in parallel. Teammates — {hints}",
        {
            "type": "object",
            "properties": {
                "agent_id": {"type": "string", "enum": [slug for slug, _ in members]},
                "task": {
                    "type": "string",
                    "description": "The task with all the context the teammate needs.",
                },
            },
            "required": ["agent_id", "task"],
            "additionalProperties": False,
        },
    )


def task_tool(agent: ResolvedAgent) -> tuple[str, str, dict[str, Any]]:
    """``task(alias, prompt)`` over the agent's subagents (Xema Agent Concepts, 'Subagents')."""
    about = "; ".join(
        f"{n.alias} ({n.agent}@{n.version})"
        + (f": {n.system_prompt[:120]}" if n.system_prompt else "")
        for n in agent.subagents
    )
    return (
        "task",
        "Run a subagent on a prompt in its own bounded context and get its result. "
        f"Subagents — {about}",
        {
            "type": "object",
            "properties": {
                "alias": {"type": "string", "enum": [n.alias for n in agent.subagents]},
                "prompt": {"type": "string"},
            },
            "required": ["alias", "prompt"],
            "additionalProperties": False,
        },
    )
