"""The built-in workspace tools (docs/workspaces.md): ``write_file``, ``read_file``,
``list_files`` and ``delete_file`` on the workspace the session works in.

Offered to every session's agent unless its ``blocked_tools`` names them. Text travels
as it is, binary data as base64. Every refusal (a bad path, a limit, a missing file,
bad arguments) is a :class:`~baton.agents.tools.ToolError` ``<code>: <why>`` the model
reads and can correct, never a failed activity.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from baton.agents.tools import ToolError, args_schema
from baton.contracts.tool_args import (
    WORKSPACE_ARGS,
    DeleteFileArgs,
    ReadFileArgs,
    WriteFileArgs,
)
from baton.contracts.workspaces import WORKSPACE_TOOLS, FileInfo
from baton.errors import BatonError
from baton.workspaces.store import Workspace

#: What the model reads about each workspace tool.
DESCRIPTIONS = {
    "write_file": "Write a file to this session's workspace (replacing one at that path). "
    "path is relative to the workspace (folders are made as needed); content is text, or "
    "base64 with encoding=base64 for binary data. The file's type follows its extension "
    "(report.md, chart.png). Returns the file's path, size, content_type and modified time.",
    "read_file": "Read a file of this session's workspace. Text comes back as it is, "
    "binary data as base64 (see encoding). A large file is read in parts: offset (first "
    "byte) and length; truncated=true says more follows.",
    "list_files": "List the files of this session's workspace (files a person attached "
    "and files written here): path, size, content_type, modified, with the totals and "
    "the workspace's limits.",
    "delete_file": "Delete a file of this session's workspace.",
}


def workspace_tools(blocked: list[str]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(name, description, JSON Schema)`` of the workspace tools an agent is offered:
    all four unless its ``blocked_tools`` withdraws some (narrowing only). Each schema is a
    fresh copy."""
    return [
        (name, DESCRIPTIONS[name], copy.deepcopy(args_schema(WORKSPACE_ARGS[name])))
        for name in WORKSPACE_TOOLS
        if name not in blocked
    ]


def _info(f: FileInfo) -> dict[str, Any]:
    return f.model_dump(mode="json")


def _parsed(model: type[BaseModel], name: str, args: dict[str, Any]) -> Any:
    try:
        return model.model_validate(args)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
            for e in exc.errors()[:5]
        )
        raise ToolError(f"invalid arguments for {name}: {problems}") from exc


def _write(ws: Workspace, args: WriteFileArgs) -> dict[str, Any]:
    if args.encoding == "base64":
        try:
            data = base64.b64decode(args.content, validate=True)
        except (binascii.Error, ValueError) as exc:
            msg = f"invalid arguments for write_file: content is not base64: {exc}"
            raise ToolError(msg) from exc
    else:
        data = args.content.encode()
    return _info(ws.write(args.path, data))


def _read(ws: Workspace, args: ReadFileArgs) -> dict[str, Any]:
    info = ws.stat(args.path)
    most = ws.limits.max_read_bytes
    length = min(args.length or most, most)
    data = ws.read(info.path, args.offset, length) if args.offset < info.size else b""
    try:
        content, encoding = data.decode(), "text"
    except UnicodeDecodeError:
        # Binary, or a part cut inside a character: base64 carries it exactly.
        content, encoding = base64.b64encode(data).decode(), "base64"
    return {
        **_info(info),
        "offset": args.offset,
        "length": len(data),
        "truncated": args.offset + len(data) < info.size,
        "encoding": encoding,
        "content": content,
    }


def _list(ws: Workspace, _: BaseModel) -> dict[str, Any]:
    files = ws.list()
    limits = ws.limits
    return {
        "files": [_info(f) for f in files],
        "count": len(files),
        "bytes": sum(f.size for f in files),
        "max_files": limits.max_files,
        "quota_bytes": limits.quota_bytes,
        "max_file_bytes": limits.max_file_bytes,
    }


def _delete(ws: Workspace, args: DeleteFileArgs) -> dict[str, Any]:
    ws.delete(args.path)
    return {"deleted": args.path}


_RUN: dict[str, Callable[[Workspace, Any], dict[str, Any]]] = {
    "write_file": _write,
    "read_file": _read,
    "list_files": _list,
    "delete_file": _delete,
}


def run_workspace_tool(workspace: Workspace, name: str, args: dict[str, Any]) -> str:
    """Run workspace tool ``name`` with the model's ``args`` on ``workspace``; its result as
    JSON text (a ``read_file`` returns at most the workspace's ``max_read_bytes``). Raises
    ToolError ``<code>: <why>`` for an unknown tool, bad arguments and every refusal of the
    store (path, limits, missing file)."""
    if name not in _RUN:
        raise ToolError(f"tool '{name}' is not a workspace tool")
    parsed = _parsed(WORKSPACE_ARGS[name], name, args)
    try:
        result = _RUN[name](workspace, parsed)
    except BatonError as exc:
        raise ToolError(f"{exc.code}: {exc.detail}") from exc
    return json.dumps(result, ensure_ascii=False)
