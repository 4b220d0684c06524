"""``/v1/sessions/{id}/files``: the session's workspace (docs/workspaces.md): list, download,
and a person's upload (a ``workspace_attached`` event and an ``attachment`` message).

Readable by whoever may read the session (:func:`api.routers.sessions.require_session`);
writable only by its agent (through its tools) and its owner (:func:`require_writer`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Path, Query, Request, status
from fastapi.responses import StreamingResponse
from sqlalchemy.engine import Engine

from api.deps import Caller, CallerDep, EngineDep, WorkspacesDep
from api.problems import problem_responses
from api.routers.sessions import SessionIdPath, require_session
from baton.agents.schemas import Page
from baton.contracts.codes import WORKSPACE_READ_ONLY
from baton.contracts.workspaces import FileInfo
from baton.errors import BatonError
from baton.runs import attachments, session_store
from baton.storage.db import SessionRow, session_scope
from baton.workspaces.store import FileTooLarge, Workspace, WorkspaceStore, inline_safe

router = APIRouter(prefix="/v1/sessions", tags=["files"])

FilePath = Annotated[str, Path(description="The file's path in the workspace.", max_length=2048)]
#: Bytes a download streams at a time.
CHUNK = 64 * 1024


class WorkspaceReadOnly(BatonError):
    """A write to a workspace by someone other than the session's owner (403)."""

    code = WORKSPACE_READ_ONLY
    status = 403
    title = "Forbidden"


def require_writer(caller: Caller, row: SessionRow) -> None:
    """The write rule of a workspace through the API: the session's owner (who started
    it); with auth off everyone is ``local``, its owner. Its agent writes through its tools.
    Raises WorkspaceReadOnly (403)."""
    if caller.auth and caller.user != row.created_by_user:
        raise WorkspaceReadOnly(
            f"only the session's owner ({row.created_by_user}) and its agent may write here"
        )


def _workspace(
    engine: Engine, store: WorkspaceStore, caller: Caller, session_id: str, *, write: bool
) -> Workspace:
    """The workspace ``session_id`` works in, once the caller may read the session (404,
    403) and, for ``write``, write to it (403)."""
    require_session(engine, caller, "viewer", session_id=session_id)
    with session_scope(engine) as s:
        row = session_store.get_session(s, session_id=session_id)
        if write:
            require_writer(caller, row)
        return store.workspace(row.workspace_id or row.id)


@router.get(
    "/{session_id}/files", responses=problem_responses(401, 403, 404, 422), summary="List files"
)
async def list_files(
    session_id: SessionIdPath, engine: EngineDep, store: WorkspacesDep, caller: CallerDep
) -> Page[FileInfo]:
    """The files of the workspace the session works in (its own, or its caller's for a
    ``shareable`` delegation), by path."""
    ws = await asyncio.to_thread(_workspace, engine, store, caller, session_id, write=False)
    files = await asyncio.to_thread(ws.list)
    return Page(data=files, count=len(files))


def _disposition(path: str, inline: bool) -> str:
    """``Content-Disposition`` naming the file (RFC 6266: an ASCII name and a UTF-8 one)."""
    name = path.rsplit("/", 1)[-1]
    ascii_name = name.encode("ascii", "replace").decode().replace('"', "_").replace("?", "_")
    kind = "inline" if inline else "attachment"
    return f"{kind}; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(name, safe='')}"


@router.get(
    "/{session_id}/files/{path:path}",
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The file"},
        **problem_responses(401, 403, 404, 422),
    },
    summary="Download a file",
)
async def download_file(
    session_id: SessionIdPath,
    path: FilePath,
    engine: EngineDep,
    store: WorkspacesDep,
    caller: CallerDep,
    inline: Annotated[
        bool,
        Query(
            description="Ask to show it in the browser: honoured for raster images and "
            "plain text only; anything else is an attachment."
        ),
    ] = False,
) -> StreamingResponse:
    """The file, streamed, with its content type and ``Content-Disposition: attachment``
    (``inline`` only when asked and safe: raster images, plain text), ``nosniff`` and a
    sandboxing CSP: HTML or SVG never runs in the API's origin. 404 ``file_not_found``,
    422 ``invalid_path``."""
    ws = await asyncio.to_thread(_workspace, engine, store, caller, session_id, write=False)
    info = await asyncio.to_thread(ws.stat, path)
    handle = await asyncio.to_thread(ws.open, info.path)

    def chunks() -> Iterator[bytes]:
        with handle:
            while block := handle.read(CHUNK):
                yield block

    return StreamingResponse(
        chunks(),  # a sync iterator: Starlette reads it on its thread pool
        media_type=info.content_type,
        headers={
            "Content-Length": str(info.size),
            "Content-Disposition": _disposition(
                info.path, inline and inline_safe(info.content_type)
            ),
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'none'; sandbox",
            "Cache-Control": "private, no-store",
        },
    )


async def _body(request: Request, limit: int) -> bytes:
    """The request body, refused FileTooLarge (413) as soon as it passes ``limit`` bytes
    (its declared Content-Length first), so an oversized upload is never held whole."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise FileTooLarge(f"{declared} bytes: a workspace file has at most {limit} bytes")
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise FileTooLarge(f"more than {limit} bytes: a workspace file has at most {limit}")
        parts.append(chunk)
    return b"".join(parts)


@router.put(
    "/{session_id}/files/{path:path}",
    status_code=status.HTTP_201_CREATED,
    responses=problem_responses(401, 403, 404, 409, 413, 415, 422),
    summary="Attach a file",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
async def upload_file(
    session_id: SessionIdPath,
    path: FilePath,
    request: Request,
    engine: EngineDep,
    store: WorkspacesDep,
    caller: CallerDep,
) -> FileInfo:
    """Attach the request body as the file at ``path`` (replacing one there), as the
    session's owner; the session hears of it (``workspace_attached`` event, an
    ``attachment`` message its agent reads next). Refused before anything is stored: 422
    ``invalid_path``, 413 ``file_too_large``, 409 ``too_many_files`` /
    ``workspace_quota_exceeded``, 415 ``content_type_refused``, 403
    ``workspace_read_only``."""
    ws = await asyncio.to_thread(_workspace, engine, store, caller, session_id, write=True)
    data = await _body(request, ws.limits.max_file_bytes)
    declared = request.headers.get("content-type")
    info = await asyncio.to_thread(ws.write, path, data, declared)

    def record() -> None:
        with session_scope(engine) as s:
            attachments.record_attachment(s, session_id=session_id, info=info, by=caller.user)

    await asyncio.to_thread(record)
    return info
