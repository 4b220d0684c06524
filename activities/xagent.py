"""X-Agent activities: authorize (ACL, policy, open a review), settle a review, refuse,
run list/create/read tools, and delegate (invoke_agent) — Gamut X-Agent and X-Agent
Policies; docs/xagent.md.

Every activity stores the tool call's result as a ``tool`` message under the id
the workflow chose, in the same transaction as its other writes, so a retry
finds the stored result instead of acting twice.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from pydantic import ValidationError
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select
from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError

from activities.outcomes import cancelled_outcome, heartbeating, store_result, stored_outcome
from baton import telemetry
from baton.agents import registry
from baton.agents.spec import AgentSpec
from baton.contracts.activity_io import (
    AgentEdit,
    AuthorizeInput,
    AuthorizeResult,
    RefusalInput,
    SettleInput,
    SettleResult,
    ToolMessage,
    ToolOutcome,
    XAgentCall,
)
from baton.contracts.tool_args import CreateAgentArgs, GetAgentSessionsArgs, GetTranscriptArgs
from baton.contracts.workflow_io import ReviewDecision
from baton.errors import BatonError
from baton.evals import replay
from baton.grants import auth, policies
from baton.permissions import gate, reviews
from baton.runs import run_tree, session_store, transcript_text
from baton.settings import DEV_REVIEW_KEY
from baton.storage.db import Agent, AgentLivePointer, ReviewRow, SessionRow, session_scope, utcnow
from baton.webhooks import events as webhook_events

#: Longest inline reply an invoke returns to the caller's model (characters).
MAX_INLINE_REPLY = 32_000
#: Characters of a reviewer's edited instructions the caller's create result shows.
EDITED_INSTRUCTIONS_SHOWN = 2_000
TRANSCRIPT_POLL_S = 0.25
#: Longest a sync transcript read waits for a running turn (inside the 60 s tool timeout).
TRANSCRIPT_WAIT_S = 45.0
AUDIT_OUTCOME = {
    "allowed": "allow",
    "denied": "denied_by_user",
    "timed_out": "review_timeout",
    "withdrawn": "withdrawn",
}


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " … (cut)"


def _slugify(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:56].strip("-")
    return slug or "agent"


def _agent(s: Session, slug: str) -> Agent | None:
    return s.exec(select(Agent).where(Agent.slug == slug)).first()


def refuse(
    s: Session,
    tool: ToolMessage,
    decision: gate.Decision,
    operation: str,
    target: str | None,
    via: str | None = None,
) -> ToolOutcome:
    """Store a refusal of :func:`baton.permissions.gate.decide` as the tool's error result,
    audited as a ``block`` (with the path it came by) when the decision says who refused."""
    if decision.decided_by is not None:
        reviews.add_audit(
            s,
            session_id=tool.session_id,
            caller=tool.agent_slug,
            operation=operation,
            target=target,
            outcome="block",
            decided_by=decision.decided_by,
            # Guards audit their code (the message is the model's); ACL and policy their text.
            reason=(decision.code or "") if decision.decided_by == "guard" else decision.text,
            via=via,
        )
    return store_result(s, tool, decision.text, ok=False)


def save_always_allow(s: Session, row: ReviewRow, decision: ReviewDecision) -> None:
    """The policy an Always Allow saves (Gamut X-Agent Policies, 'Always Allow'), and its
    scope on the review row: ``list`` is global only; read and invoke are per-target
    (``scope: target``, the default) or global (``all``); ``create`` never stores one. An
    agent deleted while the review waited gets no policy: a later agent reusing its slug
    must not inherit it (the decision is then an allow-once)."""
    if row.operation == "create":
        return
    scope = "all" if row.operation == "list" else (decision.scope or "target")
    target = None if scope == "all" else row.target_agent_slug
    if _agent(s, row.caller_agent_slug) is None or (
        target is not None and _agent(s, target) is None
    ):
        return
    row.scope = scope
    policies.save_policy(
        s, caller=row.caller_agent_slug, operation=row.operation, target=target, decision="allow"
    )


def _denied(row: ReviewRow, inp: SettleInput) -> str:
    """The tool error the model reads for a review denied by a person or by its timeout, or
    withdrawn because a newer message interrupted the turn."""
    what = f"{row.operation} '{row.target_agent_slug}'" if row.target_agent_slug else row.operation
    if inp.outcome == "timed_out":
        return (
            f"the review timed out after {inp.timeout_s:g} s without a decision; "
            f"the {what} operation was denied"
        )
    if inp.outcome == "withdrawn":
        return (
            f"the review of the {what} operation was withdrawn: a newer message from the "
            "person interrupted this turn"
        )
    return f"the {what} operation was denied by {row.decided_by}"


def _covered(s: Session, row: ReviewRow) -> list[tuple[str, str]]:
    """The other pending reviews of ``row``'s caller and operation that the stored
    policies now allow: ``(review id, session id)`` each."""
    return [
        (other.id, other.session_id)
        for other in reviews.pending_for(s, caller=row.caller_agent_slug, operation=row.operation)
        if other.id != row.id
        and policies.decide(
            s,
            caller=other.caller_agent_slug,
            operation=other.operation,
            target=other.target_agent_slug,
        )
        == "allow"
    ]


class XAgentActivities:
    """The X-Agent activities, built with the DB engine and a Temporal client."""

    def __init__(
        self, engine: Engine, client: Client, *, review_key: bytes = DEV_REVIEW_KEY
    ) -> None:
        self._engine = engine
        self._client = client
        # Verifies the proofs on decisions and signs the worker's own (Settings.review_key).
        self._review_key = review_key

    # --- authorize: ACL, then policy, then (maybe) a review -------------------

    @activity.defn(name="authorize")
    def authorize(self, inp: AuthorizeInput) -> AuthorizeResult:
        """Decide one X-Agent call with :func:`baton.permissions.gate.decide`; ``review``
        opens a review row.

        Gamut X-Agent Policies: guards and ACL checks run first; a block is audited and refused at
        once; a review records the row, a ``review_requested`` event and the session
        status ``awaiting_input``. Refusals are stored as the tool's error result.

        Idempotent on ``review_id``: once this activity has opened the review, a
        retry (the worker died before Temporal recorded the result) returns
        ``review`` again without re-evaluating the policy, so a policy edited
        meanwhile cannot leave the review pending with nobody waiting on it.
        """
        tool = inp.tool
        caller = tool.agent_slug
        with session_scope(self._engine) as s:
            done = stored_outcome(s, tool.message_id)
            if done is not None:
                return AuthorizeResult(decision="refused", outcome=done)
            if s.get(ReviewRow, inp.review_id) is not None:
                return AuthorizeResult(decision="review")
            if session_store.is_closed(s, session_id=tool.session_id):
                # Cancelled while this ran: no review nobody could settle, no audit row.
                return AuthorizeResult(decision="refused", outcome=cancelled_outcome(tool))
            decision = gate.decide(
                s,
                gate.Request(
                    caller=caller,
                    operation=inp.operation,
                    target=inp.target,
                    user=inp.user,
                    auth=inp.auth,
                    invoked=inp.invoked,
                    via="invoke" if inp.operation == "invoke" else None,
                ),
            )
            if decision.verdict == "refuse":
                return AuthorizeResult(
                    decision="refused", outcome=refuse(s, tool, decision, inp.operation, inp.target)
                )
            ev = replay.replay_of(s, session_id=tool.session_id)
            if ev is not None:  # an eval's replay: recorded, and never asks a person
                denied = replay.decide_in_replay(
                    s,
                    ev,
                    session_id=tool.session_id,
                    caller=caller,
                    operation=inp.operation,
                    target=inp.target,
                    verdict=decision.verdict,
                )
                if denied is None:
                    return AuthorizeResult(decision="allow")
                return AuthorizeResult(
                    decision="refused", outcome=store_result(s, tool, denied.text, ok=False)
                )
            if decision.verdict == "allow":
                return AuthorizeResult(decision="allow")
            row, created = reviews.open_review(
                s,
                review_id=inp.review_id,
                session_id=tool.session_id,
                caller=caller,
                operation=inp.operation,
                target=inp.target,
                preview=inp.preview,
                expires_at=inp.expires_at,
            )
            if created:
                data = {
                    "review_id": row.id,
                    "caller": caller,
                    "operation": inp.operation,
                    "target": inp.target,
                    "preview": inp.preview,
                }
                session_store.append_event(
                    s, session_id=tool.session_id, type="review_requested", data=data
                )
                # A review deep in a run must reach whoever watches the run's root.
                run_tree.forward(s, tool.session_id, "review_requested", data)
                session_store.set_status(s, session_id=tool.session_id, status="awaiting_input")
                webhook_events.review_opened(s, row)
            return AuthorizeResult(decision="review")

    # --- settle_review: the one outcome of a review ---------------------------

    @activity.defn(name="settle_review")
    async def settle_review(self, inp: SettleInput) -> SettleResult:
        """Record a review's outcome once: row, audit, saved policy, refusal result.

        An ``always_allow`` (never for create) saves the policy; every other
        pending review that the new policy now allows is then resolved by
        signalling its session (Gamut X-Agent Policies, 'Always Allow'), with a proof so it
        is recorded as the policy's doing. Who the decision is recorded as and
        whether it may save a policy is :func:`baton.permissions.reviews.credit` (an
        unproven decision: ``temporal (unverified)``, no policy in auth mode).

        ``inp.then`` (a list or a read) runs once the review is settled allowed, exactly as
        ``xagent_tool`` runs it (same transaction, idempotent on the tool's message id), in
        the same thread: its result is ``SettleResult.ran``. A retry settles nothing twice
        and finds the tool result stored.
        """
        telemetry.annotate(
            review=inp.review_id, session=inp.tool.session_id, agent=inp.tool.agent_slug
        )
        result, covered = await asyncio.to_thread(self._settle_then_run, inp)
        for review_id, session_id in covered:
            decision = reviews.prove(
                self._review_key,
                ReviewDecision(
                    review_id=review_id,
                    decision="allow_once",
                    decided_by=f"policy (always_allow on {inp.review_id})",
                ),
            )
            try:
                await self._client.get_workflow_handle(session_id).signal(
                    "review_decision", decision
                )
            except RPCError as exc:  # that session ended meanwhile: nothing left to resolve
                activity.logger.info("review %s not resolved: %s", review_id, exc.message)
        return result

    def _settle_then_run(self, inp: SettleInput) -> tuple[SettleResult, list[tuple[str, str]]]:
        result, covered = self._settle(inp)
        if result.allowed and inp.then is not None:
            result = result.model_copy(update={"ran": self._xagent_tool(inp.then)})
        return result, covered

    def _settle(self, inp: SettleInput) -> tuple[SettleResult, list[tuple[str, str]]]:
        """The one outcome of review ``inp.review_id``, applied once (a retry finds it
        settled): the row, an always-allow's policy, the audit row, the events, a denial's
        tool result; then the ids and sessions of the other pending reviews the saved
        policy now allows (for the caller to signal)."""
        tool = inp.tool
        covered: list[tuple[str, str]] = []
        with session_scope(self._engine) as s:
            row = reviews.get_review(s, review_id=inp.review_id)
            if row.status == "pending":
                d = inp.decision
                credited = reviews.credit(self._review_key, d, auth=inp.auth) if d else None
                row.status = inp.outcome
                row.decision = credited.decision if credited else None
                undecided = "interrupted" if inp.outcome == "withdrawn" else "timeout"
                row.decided_by = credited.decided_by if credited else undecided
                row.decision_id = d.decision_id if d else None
                row.decided_at = utcnow()
                if d is not None and credited is not None and credited.decision == "always_allow":
                    save_always_allow(s, row, d)
                s.add(row)
                reviews.count_settled(s, row)
                reason = credited.reason if credited else f"no decision within {inp.timeout_s:g} s"
                if inp.outcome == "withdrawn":
                    reason = "withdrawn: a newer message interrupted the turn"
                reason += self._edit_reason(row, tool, d)
                reviews.add_audit(
                    s,
                    session_id=row.session_id,
                    review_id=row.id,
                    caller=row.caller_agent_slug,
                    operation=row.operation,
                    target=row.target_agent_slug,
                    outcome=AUDIT_OUTCOME[inp.outcome],  # type: ignore[arg-type]
                    decided_by=row.decided_by,
                    reason=reason,
                )
                resolved = reviews.resolved_event(row)
                session_store.append_event(
                    s, session_id=row.session_id, type="review_resolved", data=resolved
                )
                run_tree.forward(s, row.session_id, "review_resolved", resolved)
                webhook_events.review_resolved(s, row)
                if inp.outcome != "allowed":
                    store_result(s, tool, _denied(row, inp), ok=False)
                if reviews.pending_in_session(s, session_id=row.session_id) == 0:
                    srow = session_store.get_session(s, session_id=row.session_id)
                    if srow.status == "awaiting_input":
                        session_store.set_status(s, session_id=row.session_id, status="running")
            if row.status == "allowed" and row.scope is not None:
                # Recomputed on every attempt: a retry after the commit must still release
                # the reviews the saved policy covers (signalling twice is harmless).
                covered = _covered(s, row)
            allowed = row.status == "allowed"
            outcome = None if allowed else stored_outcome(s, tool.message_id)
            edits = self._proven_edits(row, inp.decision)
            by = row.decided_by or ""
            prompt = edits.get("edited_prompt")
            name, instructions = edits.get("edited_name"), edits.get("edited_instructions")
            agent_edit = None
            if name is not None or instructions is not None:
                agent_edit = AgentEdit(name=name, instructions=instructions, by=by)
            return SettleResult(
                allowed=allowed,
                outcome=outcome,
                edited_prompt=prompt,
                edited_by=by if prompt is not None else None,
                edited_agent=agent_edit,
            ), covered

    def _proven_edits(self, row: ReviewRow, decision: ReviewDecision | None) -> dict[str, str]:
        """The edits an allowed operation runs with instead of the caller's arguments
        (``{field: value}``, :data:`baton.permissions.reviews.EDIT_FIELDS`): the decision's
        edits when the decision applied is this one, its proof (which signs the edits) holds
        and each is one its operation takes (:func:`baton.permissions.reviews.edit_refusal`);
        none otherwise (an edit cannot be altered in transit)."""
        d = decision
        if d is None or row.status != "allowed" or row.decision_id != d.decision_id:
            return {}
        edits = reviews.edits_of(d)
        if not edits or reviews.edit_refusal(row.operation, d.decision, edits) is not None:
            return {}
        return edits if reviews.is_proven(self._review_key, d) else {}

    def _edit_reason(self, row: ReviewRow, tool: ToolMessage, d: ReviewDecision | None) -> str:
        """The audit reason's part for the decision's edits: who edited what, original and
        edited (:func:`baton.permissions.reviews.edit_note`), or that they were ignored."""
        sent = reviews.edits_of(d) if d is not None else {}
        if d is None or not sent:
            return ""
        applied = self._proven_edits(row, d)
        if not applied:
            what = " and ".join(reviews.edit_label(f) for f in sent)
            why = "without a valid proof"
            if reviews.is_proven(self._review_key, d):
                why = f"that this {row.operation} review does not take"
            return f"; an edit of the {what} {why} was ignored"
        args = tool.call.args
        originals = {
            "edited_prompt": row.preview,
            "edited_name": str(args.get("name") or ""),
            "edited_instructions": str(args.get("instructions") or ""),
        }
        return reviews.edit_note(
            row.decided_by or "",
            [(reviews.edit_label(f), originals[f], v) for f, v in applied.items()],
        )

    # --- refuse_tool: guards and malformed arguments ---------------------------

    @activity.defn(name="refuse_tool")
    def refuse_tool(self, inp: RefusalInput) -> ToolOutcome:
        """Store a refusal as the tool's error result; guard refusals are audited as blocks."""
        with session_scope(self._engine) as s:
            done = stored_outcome(s, inp.tool.message_id)
            if done is not None:
                return done
            if inp.audit and inp.operation is not None:
                reviews.add_audit(
                    s,
                    session_id=inp.tool.session_id,
                    caller=inp.tool.agent_slug,
                    operation=inp.operation,
                    target=inp.target,
                    outcome="block",
                    decided_by="guard",
                    reason=inp.code,
                    via=inp.via,
                )
            return store_result(s, inp.tool, f"{inp.code}: {inp.error}", ok=False)

    # --- list / create / read ----------------------------------------------------

    @activity.defn(name="xagent_tool")
    async def xagent_tool(self, inp: XAgentCall) -> ToolOutcome:
        """Run list_agents, create_agent, get_agent_sessions or get_agent_session_transcript.

        Async so that a transcript read waiting for a running turn holds no thread.
        """
        if inp.tool.call.name == "get_agent_session_transcript":
            await self._wait_for_turn(inp)
        async with heartbeating():  # a lost worker's call is retried after the heartbeat timeout
            return await asyncio.to_thread(self._xagent_tool, inp)

    def _xagent_tool(self, inp: XAgentCall) -> ToolOutcome:
        tool = inp.tool
        name = tool.call.name
        with session_scope(self._engine) as s:
            done = stored_outcome(s, tool.message_id)
            if done is not None:
                return done
            try:
                with s.begin_nested():
                    text = self._run(s, inp)
                ok = True
            except (BatonError, ValidationError) as exc:
                detail = exc.detail if isinstance(exc, BatonError) else str(exc)
                text, ok = f"{name} failed: {detail}", False
            return store_result(s, tool, text, ok=ok)

    def _run(self, s: Session, inp: XAgentCall) -> str:
        caller = inp.tool.agent_slug
        call = inp.tool.call
        if call.name == "list_agents":
            return self._list_agents(s, caller, inp)
        if call.name == "create_agent":
            edit = inp.edited_agent
            edited = {} if edit is None else edit.model_dump(exclude={"by"}, exclude_none=True)
            # The reviewer's edit passes the tool's own argument checks again (one rule).
            create = CreateAgentArgs.model_validate({**call.args, **edited})
            return self._create_agent(s, caller, inp, create)
        if call.name == "get_agent_sessions":
            args = GetAgentSessionsArgs.model_validate(call.args)
            registry.get_agent(s, slug=args.slug)
            rows, total = session_store.list_sessions(
                s, agent=args.slug, limit=args.limit, offset=args.offset
            )
            return _json(
                {
                    "sessions": [
                        {
                            "session_id": r.id,
                            "name": r.name,
                            "created_at": r.created_at.isoformat(),
                            "last_activity_at": r.last_activity_at.isoformat(),
                            "message_count": r.message_count,
                            "running": r.status in ("running", "awaiting_input"),
                        }
                        for r in rows
                    ],
                    "count": total,
                }
            )
        args_t = GetTranscriptArgs.model_validate(call.args)
        return self._transcript(s, args_t)

    @staticmethod
    def _list_agents(s: Session, caller: str, inp: XAgentCall) -> str:
        rows = s.exec(
            select(Agent)
            .join(AgentLivePointer, col(AgentLivePointer.agent_id) == col(Agent.id))
            .where(Agent.slug != caller, col(Agent.retired).is_(False))
            .order_by(col(Agent.slug))
        ).all()
        visible = set(auth.accessible(s, user_id=inp.user)) if inp.auth else None
        agents = [
            {"slug": a.slug, "name": a.name, "description": a.description}
            for a in rows
            if visible is None or a.slug in visible
        ]
        return _json({"agents": agents})

    @staticmethod
    def _create_agent(s: Session, caller: str, inp: XAgentCall, args: CreateAgentArgs) -> str:
        # A slug the registry refuses (an agent has it; in auth mode, a deleted agent's
        # sessions still carry it) is taken: the tool picks the next free suffix instead.
        slug = registry.free_slug(s, base=_slugify(args.name), auth=inp.auth)
        spec = AgentSpec.model_validate({"system_prompt": args.instructions or ""})
        registry.create_agent(
            s,
            slug=slug,
            name=args.name,
            description=args.description or "",
            spec=spec,
            user=inp.user if inp.auth else None,
        )
        registry.publish(s, slug=slug)
        if inp.auth:
            auth.copy_acl(s, source=caller, target=slug, owner=inp.user)
        result: dict[str, Any] = {"slug": slug, "name": args.name, "version": 1}
        edit = inp.edited_agent
        if edit is not None:
            what = " and ".join(
                k
                for k, v in (("name", edit.name), ("instructions", edit.instructions))
                if v is not None
            )
            result["note"] = (
                f"the reviewer ({edit.by}) edited your request; the agent was created with "
                f"the edited {what}"
            )
            if edit.instructions is not None:
                result["instructions"] = _cut(edit.instructions, EDITED_INSTRUCTIONS_SHOWN)
        return _json(result)

    async def _wait_for_turn(self, inp: XAgentCall) -> None:
        """sync=true on a running session: wait for its turn to end (Gamut X-Agent)."""
        try:
            args = GetTranscriptArgs.model_validate(inp.tool.call.args)
        except ValidationError:
            return
        if not args.sync:
            return

        def running() -> bool:
            with session_scope(self._engine) as s:
                row = s.get(SessionRow, args.session_id)
                return row is not None and row.status in ("running", "awaiting_input")

        deadline = time.monotonic() + TRANSCRIPT_WAIT_S
        while time.monotonic() < deadline and await asyncio.to_thread(running):
            activity.heartbeat()
            await asyncio.sleep(TRANSCRIPT_POLL_S)
        # Still running: the transcript so far, its status line says so.

    @staticmethod
    def _transcript(s: Session, args: GetTranscriptArgs) -> str:
        row = session_store.get_session(s, session_id=args.session_id)
        if row.agent_slug != args.slug:
            raise SessionOfOtherAgent(
                f"session '{args.session_id}' is not a session of '{args.slug}'"
            )
        # Rendered by transcript_text's rules: a message's own line breaks become
        # continuation lines (no forged "[user] …" entry) and an external process's
        # messages say so.
        outside = transcript_text.written_outside(s, session_id=args.session_id)
        lines = [f"status: {row.status}"]
        for m in session_store.messages(s, session_id=args.session_id):
            if m.role == "tool":
                given = session_store.summarise(session_store.json_compact(m.tool_args or {}), 200)
                got = session_store.summarise(m.text, 200)
                lines.append(
                    transcript_text.entry(
                        f"[tool {m.tool_name}] ", f"input: {given} → output: {got}"
                    )
                )
                continue
            text = m.text
            if m.tool_calls:
                text += " " + " ".join(f"(calls {c['name']})" for c in m.tool_calls)
            who = f"{m.role} {m.agent_slug}" if m.role == "assistant" else m.role
            if transcript_text.by_outside(m, outside=outside):
                who += f" · {transcript_text.EXTERNAL_MARK}"
            lines.append(transcript_text.entry(f"[{who}] ", text))
        return "\n".join(lines)


class SessionOfOtherAgent(BatonError):
    """A session id given for one agent belongs to another."""

    code = "session_of_other_agent"


class SessionNotContinuable(BatonError):
    """The session to continue is closed."""

    code = "session_closed"
    status = 409
