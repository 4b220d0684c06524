"""The arguments a model (or an external process over MCP) passes to Baton's own tools:
the five X-Agent tools, the two delegation tools, the four workspace tools and
``present_exhibit``.
``extra="forbid"``: an unknown argument is refused in the tool result, never ignored."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from baton.contracts.text import SESSION_ID_PATTERN, SLUG_PATTERN, SafeText, Task
from baton.contracts.values import MAX_MESSAGE_CHARS


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ListAgentsArgs(_Args):
    """``list_agents()``: no parameters."""


#: A new agent's display name as ``create_agent`` takes it, and as a reviewer may edit it
#: (docs/xagent.md, Reviews): storable text, 1-200 characters.
AgentName = Annotated[SafeText, Field(min_length=1, max_length=200)]
#: A new agent's instructions (its system prompt), likewise: up to 100,000 characters.
AgentInstructions = Annotated[SafeText, Field(max_length=100_000)]


class CreateAgentArgs(_Args):
    """``create_agent(name, description?, instructions?)``."""

    name: AgentName = Field(description="Display name of the new agent.")
    description: SafeText | None = Field(
        default=None, max_length=2000, description="One-line description."
    )
    instructions: AgentInstructions | None = Field(
        default=None, description="The new agent's system prompt."
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


#: A path a workspace tool takes (at most baton.workspaces.store.MAX_PATH_CHARS characters).
WorkspacePath = Annotated[
    str, Field(min_length=1, max_length=512, description="A path relative to the workspace.")
]


class WriteFileArgs(_Args):
    """``write_file(path, content, encoding="text")``."""

    path: WorkspacePath
    content: str = Field(description="The file's content: text, or base64 when encoding is base64.")
    encoding: Literal["text", "base64"] = Field(
        default="text", description="text (stored as UTF-8) or base64 (binary data)."
    )


class ReadFileArgs(_Args):
    """``read_file(path, offset=0, length?)``."""

    path: WorkspacePath
    offset: int = Field(default=0, ge=0, description="First byte to read.")
    length: int | None = Field(
        default=None, ge=1, description="Bytes to read (default and most: the read limit)."
    )


class ListFilesArgs(_Args):
    """``list_files()``: no parameters."""


class DeleteFileArgs(_Args):
    """``delete_file(path)``."""

    path: WorkspacePath


WORKSPACE_ARGS: dict[str, type[_Args]] = {
    "write_file": WriteFileArgs,
    "read_file": ReadFileArgs,
    "list_files": ListFilesArgs,
    "delete_file": DeleteFileArgs,
}


#: The built-in tool that shows something to the person (docs/exhibits.md).
PRESENT_EXHIBIT = "present_exhibit"
#: What an exhibit may be: inline content, or a file of the session's workspace.
ExhibitKind = Literal["image", "table", "chart", "markdown", "download", "file"]
#: The argument a claim-checked call (``present_exhibit``, ``write_file``) adds as the
#: workflow sees it: the id of the assistant message whose stored tool calls hold the
#: whole arguments.
CLAIM_CHECK = "_claim_check"
Cell = str | int | float | bool | None


class PresentExhibitArgs(_Args):
    """``present_exhibit(kind, title, …)``: the fields each kind needs are checked by
    :func:`baton.runs.exhibits.build` (docs/exhibits.md, 'Kinds'), which knows the limits."""

    kind: ExhibitKind = Field(
        description="image (base64 png/jpeg/gif/webp in data), table (columns + rows), chart "
        "(a Vega-Lite spec in spec), markdown (text), download (base64 data + filename), "
        "file (a workspace file by path)."
    )
    title: SafeText = Field(min_length=1, max_length=200, description="What the person sees.")
    data: str | None = Field(default=None, description="Base64 content (image, download).")
    media_type: str | None = Field(
        default=None, max_length=100, description="Content type of data, e.g. image/png."
    )
    filename: SafeText | None = Field(default=None, max_length=200, description="download")
    columns: list[SafeText] | None = Field(default=None, description="table: column names.")
    rows: list[list[Cell]] | None = Field(default=None, description="table: one list per row.")
    spec: dict[str, Any] | None = Field(default=None, description="chart: a Vega-Lite spec.")
    text: SafeText | None = Field(default=None, description="markdown: the text.")
    path: str | None = Field(default=None, max_length=1000, description="file: workspace path.")


#: Arguments kept whole when a ``present_exhibit`` call is shown again (history, events).
_KEPT = ("kind", "title", "media_type", "filename", "path", "columns")


def compact_exhibit_args(args: dict[str, Any]) -> dict[str, Any]:
    """``present_exhibit`` arguments without their bulk (``data``, ``rows``, ``spec``,
    ``text`` become ``"(N bytes, shown)"``): what a later model call, an event or the
    workflow carries once the exhibit is stored (claim-check, docs/exhibits.md)."""
    out: dict[str, Any] = {k: args[k] for k in _KEPT if k in args}
    for key in ("data", "rows", "spec", "text"):
        if args.get(key) is not None:
            size = len(json.dumps(args[key], ensure_ascii=False).encode())
            out[key] = f"({size} bytes, shown)"
    return out


def compact_write_args(args: dict[str, Any]) -> dict[str, Any]:
    """``write_file`` arguments without their bulk (``content`` becomes
    ``"(N bytes, claim-checked)"``): what the workflow carries of the call."""
    out: dict[str, Any] = {k: args[k] for k in ("path", "encoding") if k in args}
    if args.get("content") is not None:
        size = len(json.dumps(args["content"], ensure_ascii=False).encode())
        out["content"] = f"({size} bytes, claim-checked)"
    return out


#: The tools whose arguments are claim-checked, each with its compact form: their bulk
#: never travels through the workflow (docs/exhibits.md, docs/workspaces.md).
CLAIM_CHECKED: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    PRESENT_EXHIBIT: compact_exhibit_args,
    "write_file": compact_write_args,
}


def compact_args(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """A claim-checked tool's arguments in their compact form; any other tool's unchanged."""
    compact = CLAIM_CHECKED.get(name)
    return args if compact is None else compact(args)


def claim_checked(name: str, args: dict[str, Any], message_id: str) -> dict[str, Any]:
    """The arguments of a tool call as they travel to the workflow: a claim-checked tool's
    (:data:`CLAIM_CHECKED`: ``present_exhibit``, ``write_file``) are its compact form plus
    :data:`CLAIM_CHECK` = ``message_id`` (the assistant message storing them whole); every
    other tool's are ``args`` unchanged."""
    if name not in CLAIM_CHECKED:
        return args
    return {**compact_args(name, args), CLAIM_CHECK: message_id}
