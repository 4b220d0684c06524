"""Domain errors with stable machine-readable codes.

Every error Baton raises for bad input or a refused operation is a
:class:`BatonError` subclass carrying ``code`` (stable, snake_case), an HTTP
``status`` and optionally ``path`` (where in the submitted document the problem
is, e.g. ``spec.subagents[0].subagents[1].alias``). The API maps them to RFC 9457
problem+json; the CLI prints them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar


class BatonError(Exception):
    """Base class: ``code`` names the problem, ``status`` is the HTTP status to answer with."""

    code: ClassVar[str] = "baton_error"
    status: ClassVar[int] = 400
    title: ClassVar[str] = "Bad request"

    def __init__(self, detail: str, *, path: str | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.path = path
        self.extra = extra

    def to_problem(self) -> dict[str, Any]:
        """The RFC 9457 body: type, title, status, detail, code, path (when known), extras."""
        body: dict[str, Any] = {
            "type": f"https://baton.dev/problems/{self.code.replace('_', '-')}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
            "code": self.code,
        }
        if self.path is not None:
            body["path"] = self.path
        body.update(self.extra)
        return body


class NotFound(BatonError):
    """A named thing does not exist (404)."""

    status = 404
    title = "Not found"


class InvalidCursor(BatonError):
    """A ``cursor`` this list never gave: a transcript's naming no message of the session,
    or a session list's or the audit log's that does not decode."""

    code = "invalid_cursor"
    status = 422
    title = "Invalid cursor"


class Conflict(BatonError):
    """The request conflicts with the current state (409)."""

    status = 409
    title = "Conflict"


class InvalidSpec(BatonError):
    """An agent spec breaks a publish-time rule (400; Xema Agent Concepts, 'What bounds a tree')."""

    status = 400
    title = "Invalid agent spec"


class AgentNotFound(NotFound):
    code = "agent_not_found"


class RevisionNotFound(NotFound):
    code = "revision_not_found"


class AgentExists(Conflict):
    code = "agent_exists"


class AgentRetired(Conflict):
    code = "agent_retired"
    title = "Agent retired"


class AgentNotPublished(Conflict):
    code = "agent_not_published"
    title = "Agent has no published revision"


class AgentInUse(Conflict):
    code = "agent_in_use"
    title = "Agent is referenced by other agents"


class ConcurrentModification(Conflict):
    code = "concurrent_modification"
    title = "Concurrent modification"


class DatabaseUnavailable(BatonError):
    """The database could not be reached or stayed locked (503)."""

    code = "database_unavailable"
    status = 503
    title = "Database unavailable"


class InvalidSettings(BatonError):
    """A BATON_* setting is malformed (CLI only; the API refuses to start)."""

    code = "invalid_settings"
    title = "Invalid settings"


class InvalidReference(BatonError):
    code = "invalid_reference"
    title = "Invalid agent reference"


class InheritanceCycle(InvalidSpec):
    code = "inheritance_cycle"


class InheritanceTooDeep(InvalidSpec):
    code = "inheritance_too_deep"


class TreeTooDeep(InvalidSpec):
    code = "tree_too_deep"


class TreeTooLarge(InvalidSpec):
    code = "tree_too_large"


class DuplicateAlias(InvalidSpec):
    code = "duplicate_alias"


class UnknownAgent(InvalidSpec):
    code = "unknown_agent"


class RemovedField(InvalidSpec):
    code = "removed_field"


class SpecValidationError(InvalidSpec):
    """A spec document failed schema validation (types, patterns, unknown fields)."""

    code = "invalid_spec"


#: A problem lists at most this many validation errors (``error_count`` has the total).
MAX_REPORTED_ERRORS = 20


def format_loc(loc: Sequence[int | str]) -> str:
    """``('spec', 'subagents', 0, 'alias')`` → ``spec.subagents[0].alias``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def validation_entries(errors: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Pydantic error dicts → ``[{path, type, message}]``.

    The leading ``body`` of a FastAPI location is dropped (the body is the
    document); a ``removed_field`` error names the removed key in its path.
    """
    entries = []
    for err in errors:
        loc = list(err.get("loc", ()))
        if loc and loc[0] == "body":
            loc.pop(0)
        ctx = err.get("ctx") or {}
        if err.get("type") == "removed_field" and "field" in ctx:
            loc.append(ctx["field"])
        if err.get("type") == "json_invalid":
            loc = ["body"]  # the location FastAPI gives is a character offset, not a field
        entries.append(
            {"path": format_loc(loc), "type": str(err.get("type")), "message": str(err["msg"])}
        )
    return entries


def spec_error(entries: list[dict[str, str]]) -> BatonError:
    """The error to report for validation ``entries`` (non-empty).

    A removed field wins (400 ``removed_field``, Xema Agent Concepts); anything else is a
    :class:`SpecValidationError`. ``errors`` carries every entry.
    """
    removed = [e for e in entries if e["type"] == "removed_field"]
    first = removed[0] if removed else entries[0]
    detail = f"{first['path']}: {first['message']}" if first["path"] else first["message"]
    cls: type[BatonError] = RemovedField if removed else SpecValidationError
    shown = entries[:MAX_REPORTED_ERRORS]
    return cls(detail, path=first["path"], errors=shown, error_count=len(entries))


class SessionNotFound(NotFound):
    code = "session_not_found"


class ExhibitNotFound(NotFound):
    """No exhibit with content of that id was shown in that session (docs/exhibits.md)."""

    code = "exhibit_not_found"


class SessionBusy(Conflict):
    code = "session_busy"
    title = "Session is running a turn"


class QueueFull(Conflict):
    """A message sent with if_busy=enqueue or interrupt finds the session's queue full."""

    code = "queue_full"
    title = "Too many messages wait for this session"


class SessionClosed(Conflict):
    code = "session_closed"
    title = "Session is closed"


class EngineUnavailable(BatonError):
    """Temporal could not be reached or refused the request (503)."""

    code = "engine_unavailable"
    status = 503
    title = "Engine unavailable"


class TurnFailed(BatonError):
    """A turn ended in an error the model could not recover from (502)."""

    code = "turn_failed"
    status = 502
    title = "Turn failed"


class TurnCancelled(TurnFailed):
    """The turn ended because its session was cancelled (502, like any turn that did not
    finish). Delegations report it as ``cancelled``, not ``failed``."""

    code = "turn_cancelled"
    title = "Turn cancelled"


class InvalidBalance(BatonError):
    """A balance that is not a finite number of USD (CLI; the API answers 422)."""

    code = "invalid_balance"
    status = 422
    title = "Invalid balance"


class AdminOnly(BatonError):
    """An organisation-wide setting no API user may change in auth mode (403)."""

    code = "admin_only"
    status = 403
    title = "Admin only"


def from_database_error(exc: Exception) -> BatonError | None:
    """The domain error for a SQLAlchemy error, or None when it is not one we map.

    A unique-constraint violation is a concurrent write (409
    ``concurrent_modification``); an operational error (unreachable, locked)
    is 503 ``database_unavailable``. The message never includes the URL.
    """
    from sqlalchemy.exc import IntegrityError, OperationalError
    from sqlalchemy.orm.exc import StaleDataError

    if isinstance(exc, IntegrityError | StaleDataError):
        return ConcurrentModification("the write conflicted with a concurrent change; retry")
    if isinstance(exc, OperationalError):
        return DatabaseUnavailable(f"database error: {type(exc.orig).__name__}")
    return None


class InvalidPrompt(BatonError):
    """A message the session refuses (empty or too long)."""

    code = "invalid_prompt"
    status = 422
    title = "Invalid prompt"


class SessionExternal(Conflict):
    """The session is external: an outside process takes its turns, no model turn runs
    there (409)."""

    code = "session_external"
