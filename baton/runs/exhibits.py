"""Exhibits: what an agent shows the person (docs/exhibits.md; AgentX Agent Teams,
'Multimodal specialist output passes through').

``present_exhibit`` arguments are checked by :func:`build` (kinds, safe image types,
bounds), then :func:`record` stores the exhibit, appends its ``exhibit`` event and, when
the session runs a delegation, forwards that event unchanged to the run's root with a
``present_exhibit`` turn in the root's transcript, all in the caller's transaction.
A delegation's result carries :func:`already_displayed` over :func:`of_delegation`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from pydantic import ValidationError
from sqlalchemy import func
from sqlmodel import Session, col, select

from baton.contracts.tool_args import PRESENT_EXHIBIT, PresentExhibitArgs
from baton.contracts.values import ExhibitLimits
from baton.runs import run_tree, session_store
from baton.storage.db import ExhibitRow, MessageRow
from baton.workspaces.store import (
    FileNotFound,
    InvalidPath,
    WorkspaceStore,
    confine,
    workspace_for,
)

#: Image types rendered inline: rasters only. SVG (scripts) and HTML never are; present
#: them as a ``download``.
SAFE_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
#: Most exhibit wires one ``delegation_complete`` carries (AgentX Agent Teams, 'cap 5').
MAX_DELEGATION_EXHIBITS = 5
_MEDIA_TYPE = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]{0,62}/[a-z0-9][a-z0-9!#$&^_.+-]{0,62}$")


class ExhibitRefused(Exception):
    """``present_exhibit`` arguments that cannot be shown: the model reads why."""


@dataclass(frozen=True)
class Built:
    """A checked exhibit before it is stored: its wire without the ids, and the decoded
    content of an image or a download."""

    kind: str
    wire: dict[str, Any]
    media_type: str | None = None
    content: bytes | None = None


def exhibit_id(message_id: str) -> str:
    """The exhibit id of the ``present_exhibit`` call stored as ``message_id``: ``ex-`` and
    24 hex digits, the same on every retry."""
    return "ex-" + hashlib.sha256(message_id.encode()).hexdigest()[:24]


def content_url(session_id: str, ident: str) -> str:
    """Where the API serves an exhibit's content (image, download)."""
    return f"/v1/sessions/{session_id}/exhibits/{ident}"


def file_url(session_id: str, path: str) -> str:
    """Where the API serves a workspace file (``GET /v1/sessions/{id}/files/{path}``)."""
    return f"/v1/sessions/{session_id}/files/{quote(path)}"


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in exc.errors()[:5]
    )


def _decoded(data: str | None, limits: ExhibitLimits) -> bytes:
    if not data:
        raise ExhibitRefused("data is required: the content, base64-encoded")
    # A bound before decoding: base64 is 4 characters per 3 bytes.
    if len(data) > (limits.max_bytes + 2) // 3 * 4 + 4:
        raise ExhibitRefused(
            f"data is over {limits.max_bytes} bytes; an exhibit may hold {limits.max_bytes}"
        )
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ExhibitRefused(f"data is not valid base64: {exc}") from exc
    if len(raw) > limits.max_bytes:
        raise ExhibitRefused(f"data is {len(raw)} bytes; an exhibit may hold {limits.max_bytes}")
    return raw


def sniffed_image_type(raw: bytes) -> str | None:
    """The safe raster type ``raw`` starts like (PNG, JPEG, GIF, WebP signatures), or None."""
    if raw.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if raw.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if raw.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        return "image/webp"
    return None


def _image(args: PresentExhibitArgs, limits: ExhibitLimits) -> Built:
    declared = (args.media_type or "").lower()
    if declared not in SAFE_IMAGE_TYPES:
        raise ExhibitRefused(
            f"media_type {args.media_type!r} is not shown inline: an image is one of "
            f"{', '.join(sorted(SAFE_IMAGE_TYPES))}; present anything else (SVG, HTML) as "
            "kind download"
        )
    raw = _decoded(args.data, limits)
    if sniffed_image_type(raw) != declared:
        raise ExhibitRefused(f"data is not a {declared} image (its first bytes say otherwise)")
    wire = {"media_type": declared, "size": len(raw)}
    return Built("image", wire, declared, raw)


def _download(args: PresentExhibitArgs, limits: ExhibitLimits) -> Built:
    media = (args.media_type or "application/octet-stream").lower()
    if not _MEDIA_TYPE.match(media):
        raise ExhibitRefused(f"media_type {args.media_type!r} is not a type/subtype")
    if not args.filename or "/" in args.filename or "\\" in args.filename:
        raise ExhibitRefused("filename is required: a name without '/' or '\\'")
    raw = _decoded(args.data, limits)
    return Built(
        "download", {"media_type": media, "filename": args.filename, "size": len(raw)}, media, raw
    )


def _table(args: PresentExhibitArgs, limits: ExhibitLimits) -> Built:
    columns, rows = args.columns, args.rows
    if not columns:
        raise ExhibitRefused("columns is required: the table's column names")
    if rows is None:
        raise ExhibitRefused("rows is required: one list of cells per row")
    if len(columns) > limits.max_columns:
        raise ExhibitRefused(f"{len(columns)} columns; a table may have {limits.max_columns}")
    if len(rows) > limits.max_rows:
        raise ExhibitRefused(f"{len(rows)} rows; a table may have {limits.max_rows}")
    for i, row in enumerate(rows):
        if len(row) != len(columns):
            raise ExhibitRefused(
                f"rows.{i} has {len(row)} cells; every row has one per column ({len(columns)})"
            )
        for j, cell in enumerate(row):
            if isinstance(cell, str) and len(cell) > limits.max_cell_chars:
                raise ExhibitRefused(
                    f"rows.{i}.{j} is {len(cell)} characters; a cell may hold "
                    f"{limits.max_cell_chars}"
                )
    for j, name in enumerate(columns):
        if len(name) > limits.max_cell_chars:
            raise ExhibitRefused(f"columns.{j} is longer than {limits.max_cell_chars} characters")
    return Built("table", {"columns": columns, "rows": rows})


def _chart(args: PresentExhibitArgs, limits: ExhibitLimits) -> Built:
    if not args.spec:
        raise ExhibitRefused("spec is required: a Vega-Lite specification (JSON object)")
    size = len(json.dumps(args.spec, ensure_ascii=False))
    if size > limits.max_inline_chars:
        raise ExhibitRefused(
            f"spec is {size} characters of JSON; a chart may have {limits.max_inline_chars}"
        )
    return Built("chart", {"format": "vega-lite", "spec": args.spec})


def _markdown(args: PresentExhibitArgs, limits: ExhibitLimits) -> Built:
    if not args.text:
        raise ExhibitRefused("text is required: the markdown to show")
    if len(args.text) > limits.max_inline_chars:
        raise ExhibitRefused(
            f"text is {len(args.text)} characters; markdown may have {limits.max_inline_chars}"
        )
    return Built("markdown", {"text": args.text})


def _file(args: PresentExhibitArgs, limits: ExhibitLimits) -> Built:
    try:
        return Built("file", {"path": confine(args.path or "")})
    except InvalidPath as exc:
        raise ExhibitRefused(f"path: {exc.detail}") from exc


def of_file(built: Built, s: Session, store: WorkspaceStore, session_id: str) -> Built:
    """A ``file`` exhibit with what its workspace says of the file (its content type and
    size); ExhibitRefused when the session's workspace holds no such file."""
    if built.kind != "file":
        return built
    workspace = store.workspace(workspace_for(s, session_id))
    try:
        info = workspace.stat(built.wire["path"])
    except (FileNotFound, InvalidPath) as exc:
        raise ExhibitRefused(f"path: {exc.detail}") from exc
    wire = {**built.wire, "path": info.path, "media_type": info.content_type, "size": info.size}
    return Built("file", wire, info.content_type)


_KINDS = {
    "image": _image,
    "download": _download,
    "table": _table,
    "chart": _chart,
    "markdown": _markdown,
    "file": _file,
}


def build(args: dict[str, Any], limits: ExhibitLimits) -> Built:
    """Check ``present_exhibit`` arguments against their kind and ``limits``
    (docs/exhibits.md, 'Kinds' and 'Limits'). Raises ExhibitRefused naming the problem:
    unknown or missing fields, an image that is not png/jpeg/gif/webp (declared and by
    its signature), content over ``max_bytes``, a ragged or oversized table, a spec or
    text over ``max_inline_chars``, a path leaving the workspace."""
    try:
        parsed = PresentExhibitArgs.model_validate(args)
    except ValidationError as exc:
        raise ExhibitRefused(f"invalid arguments for {PRESENT_EXHIBIT}: {_problems(exc)}") from exc
    built = _KINDS[parsed.kind](parsed, limits)
    return Built(built.kind, {"title": parsed.title, **built.wire}, built.media_type, built.content)


def _forwarded_position(s: Session, root: str) -> str:
    """Where a forwarded exhibit sorts in the root's transcript: just after the root's
    newest own message (the call that is waiting on the delegation), after the exhibits
    forwarded there before it."""
    own = s.exec(
        select(func.max(col(MessageRow.position))).where(
            col(MessageRow.session_id) == root,
            # Forwarded turns have no call id: they are not the root model's tool results.
            (col(MessageRow.role) != "tool") | col(MessageRow.tool_call_id).is_not(None),
        )
    ).one()
    base = own or "000000.000.0000"
    taken = s.exec(
        select(func.count()).where(
            col(MessageRow.session_id) == root, col(MessageRow.position).like(f"{base}.x%")
        )
    ).one()
    return f"{base}.x{taken:03d}"


def displayed_text(wire: dict[str, Any]) -> str:
    """The ``present_exhibit`` result the model reads: what was shown, under which id."""
    return f"displayed to the person: {wire['kind']} {wire['title']!r} (exhibit {wire['id']})"


def record(
    s: Session, built: Built, *, session_id: str, agent_slug: str, message_id: str
) -> dict[str, Any]:
    """Store ``built`` as the exhibit of the ``present_exhibit`` call ``message_id`` and
    append its ``exhibit`` event; in a delegation, forward the same event to the run's
    root with a ``present_exhibit`` turn there (no call id: the root's model never reads
    it). Returns the wire. Idempotent on ``message_id``."""
    ident = exhibit_id(message_id)
    found = s.get(ExhibitRow, ident)
    if found is not None:
        return dict(found.wire)
    ctx = run_tree.context(s, session_id)
    root, delegation_id = (ctx[0], ctx[1]) if ctx else (session_id, None)
    wire: dict[str, Any] = {
        "id": ident,
        "kind": built.kind,
        **built.wire,
        "agent": agent_slug,
        "session_id": session_id,
        "delegation_id": delegation_id,
    }
    if built.content is not None:
        wire["url"] = content_url(session_id, ident)
    elif built.kind == "file":
        wire["url"] = file_url(session_id, wire["path"])
    s.add(
        ExhibitRow(
            id=ident,
            session_id=session_id,
            root_session_id=root,
            delegation_id=delegation_id,
            message_id=message_id,
            kind=built.kind,
            wire=wire,
            media_type=built.media_type,
            content=built.content,
        )
    )
    session_store.append_event(s, session_id=session_id, type="exhibit", data=wire)
    forwarded_to = run_tree.forward_top_level(s, session_id, "exhibit", wire)
    if forwarded_to is not None and not session_store.is_closed(s, session_id=forwarded_to):
        session_store.add_message(
            s,
            message_id=f"{forwarded_to}:exhibit:{ident}",
            session_id=forwarded_to,
            position=_forwarded_position(s, forwarded_to),
            role="tool",
            agent_slug=agent_slug,
            text=displayed_text(wire),
            tool_name=PRESENT_EXHIBIT,
            tool_args={"exhibit": wire},
        )
    s.flush()
    return wire


def of_delegation(
    s: Session, delegation_id: str, cap: int = MAX_DELEGATION_EXHIBITS
) -> tuple[list[dict[str, Any]], int]:
    """``(wires, total)``: the first ``cap`` exhibits presented inside the delegation, in
    the order shown, and how many there were in all."""
    where = col(ExhibitRow.delegation_id) == delegation_id
    total = s.exec(select(func.count()).select_from(ExhibitRow).where(where)).one()
    rows = s.exec(
        select(ExhibitRow.wire).where(where).order_by(col(ExhibitRow.created_at)).limit(cap)
    ).all()
    return [dict(w) for w in rows], int(total)


def already_displayed(wires: list[dict[str, Any]], total: int, agent: str) -> str:
    """The note a delegator's tool result ends with when the delegation showed exhibits
    (AgentX Agent Teams: so it does not re-invent image URLs); empty when none."""
    if not wires:
        return ""
    shown = ", ".join(f"{w['kind']} {w['title']!r} ({w['id']})" for w in wires)
    more = f" and {total - len(wires)} more" if total > len(wires) else ""
    return (
        f"\n\n[Already displayed to the person: {total} exhibit(s) from {agent}: {shown}{more}. "
        "They see them in the conversation; do not repeat them, re-create them or write "
        "image URLs or links for them: refer to them by title.]"
    )


def content(s: Session, *, session_id: str, ident: str) -> ExhibitRow | None:
    """Exhibit ``ident`` when it has content and was presented in ``session_id``."""
    row = s.get(ExhibitRow, ident)
    if row is None or row.session_id != session_id or row.content is None:
        return None
    return row
