"""Inquiries: a person's questions to an ambassador about one session (AgentX
Agent Teams).

An ambassador is an agent of ``kind: ambassador``. It runs *beside* a session and
briefs the asking person on it, from a read-only tool belt (``list_conversations``,
``read_conversation``, ``explore_conversation``, ``summarize_conversation``) plus
``draft_message``, over a bounded loop (``BATON_INQUIRY_MAX_STEPS``).

The **no-pollution invariant** (AgentX Agent Teams, 'Ambassador'): nothing an inquiry does
enters the session's transcript (``messages``), its event log (``events``), its
usage (``usage`` rows of an inquiry carry ``session_id = <inquiry id>`` and the
ambassador's slug, never the session's id) or a team's shared channel. An inquiry
writes only to ``inquiries`` (the thread: one row per question, ordered by
``created_at``, per session and user) and ``inquiry_steps`` (the ambassador's own
working transcript). Only a person sends a draft, as a real user turn
(``POST /v1/sessions/{id}/messages {from_draft}``).

Every function here reads the session side; none writes to it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlmodel import Session, col, select

from baton.agents import registry
from baton.contracts.values import ResolvedAgent
from baton.errors import BatonError, Conflict, NotFound
from baton.grants import auth
from baton.runs import run_tree, session_store, transcript_text
from baton.runs.session_store import HistoryItem
from baton.storage.db import (
    DelegationRow,
    InquiryRow,
    InquiryStepRow,
    MessageRow,
    SessionRow,
    utcnow,
)

#: Longest tool result handed back to the ambassador (characters): a long transcript is cut.
MAX_TOOL_CHARS = 12_000
#: Sessions ``list_conversations`` shows.
LIST_LIMIT = 20
#: Longest draft the ambassador may write (the limit of a user message).
MAX_DRAFT_CHARS = 64_000

SYSTEM_BRIEF = (
    "You are an ambassador: you brief the person you are talking to about a conversation "
    "their agents had, without ever taking part in it. Speak to them in the second person "
    '("your researcher found…") and name each agent by its slug. Answer only from your '
    "tools: summarize_conversation, read_conversation, explore_conversation(turn) and "
    "list_conversations; session_id defaults to the conversation you were asked about. "
    "If the person wants to say something to their agents, write it with draft_message: "
    "they review it and send it themselves. You never speak in the conversation."
)


class NoAmbassador(BatonError):
    """No ambassador named and no ``BATON_DEFAULT_AMBASSADOR`` set."""

    code = "no_ambassador"
    status = 422
    title = "No ambassador"


class NotAnAmbassador(BatonError):
    """The named agent is not of kind ambassador."""

    code = "not_an_ambassador"
    status = 422
    title = "Not an ambassador"


class NotInvocable(BatonError):
    """A session launched with an ambassador as its agent (it runs beside sessions only)."""

    code = "not_invocable"
    status = 422
    title = "Not invocable"


def require_invocable(
    session: Session, *, slug: str, live: ResolvedAgent | None = None, path: str = "agent"
) -> None:
    """Refuse to run an ambassador as the agent of a session or a step: raises NotInvocable
    (422 ``not_invocable``) when the live revision of ``slug`` is of kind ambassador.

    AgentX Agent Teams, 'Ambassador': it answers a person's inquiries beside a session and
    never enters one. The kind is :func:`baton.agents.registry.is_ambassador`'s, the test
    every cross-agent path (the permission gate) and team membership make too. ``live``:
    the live resolution when the caller has just made it (not made again); ``path``: the
    request field named in the problem.
    """
    if registry.is_ambassador(session, slug=slug, live=live):
        raise NotInvocable(
            f"'{slug}' is an ambassador: ask it about a session with "
            "POST /v1/sessions/{id}/inquiries",
            path=path,
        )


class NoQuestion(BatonError):
    """A spoken question whose transcript is empty."""

    code = "no_question"
    status = 422
    title = "No question"


class InquiryNotFound(NotFound):
    code = "inquiry_not_found"


class NoDraft(BatonError):
    """``from_draft`` names an inquiry without a draft."""

    code = "no_draft"
    status = 422
    title = "No draft"


class DraftAlreadySent(Conflict):
    code = "draft_already_sent"


class InquiryPublic(BaseModel):
    """One entry of the inquiry thread: the question, the ambassador's answer and draft."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "inquiry-3f0e…",
                    "session_id": "session-0b6c…",
                    "ambassador": "briefer",
                    "question": "What did my agents decide?",
                    "status": "answered",
                    "answer": "Your lead asked researcher for the figures…",
                    "draft": "Please double-check the Q3 number.",
                    "steps": 2,
                    "sent_message_id": None,
                }
            ]
        }
    )

    id: str
    session_id: str
    ambassador: str
    ambassador_version: int
    question: str
    status: str
    answer: str | None = None
    draft: str | None = None
    error: str | None = None
    steps: int = 0
    sent_message_id: str | None = None
    created_at: datetime
    answered_at: datetime | None = None


def to_public(row: InquiryRow) -> InquiryPublic:
    """The API shape of an inquiry row."""
    return InquiryPublic(
        id=row.id,
        session_id=row.session_id,
        ambassador=row.ambassador_slug,
        ambassador_version=row.ambassador_version,
        question=row.question,
        status=row.status,
        answer=row.answer,
        draft=row.draft,
        error=row.error,
        steps=row.steps,
        sent_message_id=row.sent_message_id,
        created_at=row.created_at,
        answered_at=row.answered_at,
    )


# --- access -----------------------------------------------------------------------------


def readable_session(session: Session, *, session_id: str, user: str, auth_on: bool) -> SessionRow:
    """The session ``user`` may read: viewer on its agent in auth mode (docs/api.md, read
    needs viewer). Raises SessionNotFound (404) or Forbidden (403). The one check every
    tool of the belt and the inquiry API call."""
    row = session_store.get_session(session, session_id=session_id)
    if auth_on:
        auth.require(session, user_id=user, agent=row.agent_slug, role="viewer")
    return row


# --- the thread -------------------------------------------------------------------------


def create(
    session: Session,
    *,
    inquiry_id: str,
    session_id: str,
    user: str,
    ambassador: str,
    version: int,
    question: str,
) -> InquiryRow:
    """Record a new inquiry (status running) at the end of its thread. Flushes."""
    row = InquiryRow(
        id=inquiry_id,
        session_id=session_id,
        user_id=user,
        ambassador_slug=ambassador,
        ambassador_version=version,
        question=question,
    )
    session.add(row)
    session.flush()
    return row


def get(session: Session, *, inquiry_id: str) -> InquiryRow:
    """An inquiry by id. Raises InquiryNotFound."""
    row = session.get(InquiryRow, inquiry_id)
    if row is None:
        raise InquiryNotFound(f"no inquiry '{inquiry_id}'")
    return row


def thread(session: Session, *, session_id: str, user: str) -> list[InquiryRow]:
    """The inquiry thread of ``user`` on ``session_id``, oldest first."""
    return list(
        session.exec(
            select(InquiryRow)
            .where(InquiryRow.session_id == session_id, InquiryRow.user_id == user)
            .order_by(col(InquiryRow.created_at), col(InquiryRow.id))
        ).all()
    )


def take_draft(session: Session, *, inquiry_id: str, session_id: str, user: str) -> str:
    """The draft text of ``user``'s inquiry on ``session_id``, to send as their message.

    Raises InquiryNotFound (another session's or user's inquiry is not found
    either), NoDraft, DraftAlreadySent (a draft is sent once).
    """
    row = session.get(InquiryRow, inquiry_id)
    if row is None or row.session_id != session_id or row.user_id != user:
        raise InquiryNotFound(f"no inquiry '{inquiry_id}' of yours on {session_id}")
    if not row.draft:
        raise NoDraft(f"inquiry '{inquiry_id}' has no draft", path="from_draft")
    if row.sent_message_id:
        raise DraftAlreadySent(f"the draft of '{inquiry_id}' was sent as {row.sent_message_id}")
    return row.draft


def mark_sent(session: Session, *, inquiry_id: str, message_id: str) -> None:
    """Remember which user message a draft became (on the inquiry row only)."""
    row = get(session, inquiry_id=inquiry_id)
    row.sent_message_id = message_id
    session.add(row)
    session.flush()


# --- the ambassador's own transcript ----------------------------------------------------


def add_step(
    session: Session,
    *,
    step_id: str,
    inquiry_id: str,
    position: str,
    role: str,
    text: str,
    tool_name: str | None = None,
    tool_call_id: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    is_error: bool = False,
) -> InquiryStepRow:
    """Store one step once (keyed by ``step_id``: a retry finds the first)."""
    found = session.get(InquiryStepRow, step_id)
    if found is not None:
        return found
    row = InquiryStepRow(
        id=step_id,
        inquiry_id=inquiry_id,
        position=position,
        role=role,
        text=text,
        tool_name=tool_name,
        tool_call_id=tool_call_id,
        tool_calls=tool_calls,
        is_error=is_error,
    )
    session.add(row)
    session.flush()
    return row


def get_step(session: Session, *, step_id: str) -> InquiryStepRow | None:
    """A stored step, or None."""
    return session.get(InquiryStepRow, step_id)


def history(session: Session, *, inquiry: InquiryRow) -> list[HistoryItem]:
    """What the ambassador's model reads: the earlier answered questions of the thread
    (continuity), then this question and its own steps so far."""
    items: list[HistoryItem] = []
    for earlier in thread(session, session_id=inquiry.session_id, user=inquiry.user_id):
        if earlier.id == inquiry.id:
            break
        if earlier.status == "answered" and earlier.answer is not None:
            items.append(HistoryItem("user", earlier.question, None, None, None, False))
            items.append(HistoryItem("assistant", earlier.answer, None, None, None, False))
    items.append(HistoryItem("user", inquiry.question, None, None, None, False))
    steps = session.exec(
        select(InquiryStepRow)
        .where(InquiryStepRow.inquiry_id == inquiry.id)
        .order_by(col(InquiryStepRow.position))
    ).all()
    for s in steps:
        items.append(
            HistoryItem(s.role, s.text, s.tool_name, s.tool_call_id, s.tool_calls, s.is_error)
        )
    return items


def finish(
    session: Session,
    *,
    inquiry_id: str,
    answer: str | None,
    steps: int,
    error: str | None = None,
) -> InquiryRow:
    """Store the answer (status answered) or the failure (status failed). Idempotent."""
    row = get(session, inquiry_id=inquiry_id)
    if row.status == "running":
        row.status = "failed" if error else "answered"
        row.answer = answer
        row.error = error
        row.steps = steps
        row.answered_at = utcnow()
        session.add(row)
        session.flush()
    return row


def set_draft(session: Session, *, inquiry_id: str, text: str) -> None:
    """Keep the ambassador's draft on its inquiry (the last one written wins)."""
    row = get(session, inquiry_id=inquiry_id)
    row.draft = text[:MAX_DRAFT_CHARS]
    session.add(row)
    session.flush()


# --- the tool belt (reads only) ---------------------------------------------------------


class BeltError(Exception):
    """A tool call the ambassador got wrong or may not make: its text goes back to the model."""


def _cut(text: str) -> str:
    if len(text) <= MAX_TOOL_CHARS:
        return text
    return text[:MAX_TOOL_CHARS] + f"\n… (cut at {MAX_TOOL_CHARS} characters)"


def _who(m: MessageRow, outside: bool) -> str:
    if transcript_text.by_outside(m, outside=outside):
        as_role = "the person" if m.role == "user" else m.agent_slug or m.role
        return f"{as_role} ({transcript_text.EXTERNAL_MARK})"
    if m.role == "user":
        return "the person"
    if m.role == "tool":
        return f"tool {m.tool_name}"
    return m.agent_slug or m.role


def _turn_of(m: MessageRow) -> int:
    head = m.position.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def list_conversations(session: Session, *, user: str, auth_on: bool) -> str:
    """The newest sessions the user may read, one a line."""
    agents = auth.accessible(session, user_id=user, role="viewer") if auth_on else None
    rows, total = session_store.list_sessions(
        session, agent=None, limit=LIST_LIMIT, offset=0, agents=agents
    )
    lines = [f"{total} conversation(s); newest {len(rows)}:"]
    for r in rows:
        team = f" · team {r.team}" if r.team else ""
        lines.append(f"- {r.id} · agent {r.agent_slug}{team} · {r.status} · {r.name}")
    return "\n".join(lines)


def read_conversation(session: Session, *, session_id: str) -> str:
    """The transcript as the person would read it, turn by turn (tool output summarised)."""
    row = session_store.get_session(session, session_id=session_id)
    outside = transcript_text.written_outside(session, session_id=session_id)
    lines = [f"conversation {row.id} with agent {row.agent_slug} ({row.status}):"]
    for m in session_store.messages(session, session_id=session_id):
        text = session_store.summarise(m.text) if m.role == "tool" else m.text
        calls = ", ".join(c["name"] for c in m.tool_calls or [])
        extra = f" [calls {calls}]" if calls else ""
        head = f"turn {_turn_of(m)} · {_who(m, outside)}: "
        lines.append(transcript_text.entry(head, f"{text}{extra}"))
    return _cut("\n".join(lines))


def explore_conversation(session: Session, *, session_id: str, turn: int) -> str:
    """One turn: its messages, every tool call with its arguments and result, and the
    delegations it started (target, task, status, result)."""
    msgs = [
        m for m in session_store.messages(session, session_id=session_id) if _turn_of(m) == turn
    ]
    if not msgs:
        raise BeltError(f"{session_id} has no turn {turn}")
    outside = transcript_text.written_outside(session, session_id=session_id)
    lines = [f"turn {turn} of {session_id}:"]
    for m in msgs:
        if m.role == "tool":
            args = session_store.json_compact(m.tool_args) if m.tool_args is not None else ""
            state = "failed" if m.is_error else "ok"
            head = f"- tool {m.tool_name}({args}) {state}: "
            lines.append(transcript_text.entry(head, session_store.summarise(m.text)))
        else:
            lines.append(transcript_text.entry(f"- {_who(m, outside)}: ", m.text))
    prefix = f"{session_id}:t{turn}:"
    found = session.exec(
        select(DelegationRow)
        .where(
            DelegationRow.parent_session_id == session_id,
            col(DelegationRow.id).startswith(prefix),
        )
        .order_by(col(DelegationRow.started_at))
    ).all()
    for d in found:
        lines.append(
            transcript_text.entry(
                "- ",
                f"delegation ({d.kind}) {d.caller_agent_slug} → {d.target_agent_slug}: "
                f"task {d.task!r} · {d.status} · result: {d.result_preview or d.error or '—'}",
            )
        )
    return _cut("\n".join(lines))


def summarize_conversation(session: Session, *, session_id: str) -> str:
    """Who took part, what each delegation did, totals, and the last reply."""
    row = session_store.get_session(session, session_id=session_id)
    msgs = session_store.messages(session, session_id=session_id)
    turns = max((_turn_of(m) for m in msgs), default=0)
    tree = run_tree.trace(session, session_id=session_id)
    team = f" in team {row.team}" if row.team else ""
    lines = [
        f"conversation {row.id}: agent {row.agent_slug}{team}, status {row.status}, "
        f"{turns} turn(s), {len(msgs)} message(s).",
        f"tokens in/out {tree.subtree_usage.input_tokens}/{tree.subtree_usage.output_tokens}, "
        "cost unknown."
        if tree.subtree_usage.cost_usd is None
        else f"cost ${tree.subtree_usage.cost_usd:.4f}.",
    ]
    outside = transcript_text.written_outside(session, session_id=session_id)
    first = next((m for m in msgs if m.role == "user"), None)
    if first is not None:
        head = f"{_who(first, outside)} asked: "
        lines.append(transcript_text.entry(head, session_store.summarise(first.text)))
    stack = list(tree.children)
    while stack:
        node = stack.pop(0)
        d = node.delegation or {}
        lines.append(
            transcript_text.entry(
                "- ",
                f"{d.get('caller', '?')} delegated to {node.agent} ({d.get('kind', '?')}): "
                f"{d.get('task', '')!r} → {node.status}: {d.get('result_preview') or '—'}",
            )
        )
        stack.extend(node.children)
    last = next((m for m in reversed(msgs) if m.role == "assistant" and m.text), None)
    if last is not None:
        lines.append(transcript_text.entry(f"last reply, by {_who(last, outside)}: ", last.text))
    return _cut("\n".join(lines))
