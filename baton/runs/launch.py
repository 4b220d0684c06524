"""Launching sessions and sending messages: the client side of SessionWorkflow.

Used by the API (and, for delegations, by activities). The agent reference is
resolved to a pin in the DB first and the session row written, then the
workflow is started with update-with-start so the first message is delivered in
the first workflow task (docs/architecture.md, a turn). Workflow and Update are addressed by their
stable Temporal names, so this module does not import workflow code.

An idle session's run completes after ``BATON_SESSION_IDLE_TIMEOUT``;
:func:`deliver_update`, which every message and external call goes through, then
starts its next run from the state stored in the DB, under the same workflow id.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy.engine import Engine
from sqlmodel import Session
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateHandle,
    WorkflowUpdateStage,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, FailureError, WorkflowAlreadyStartedError
from temporalio.exceptions import CancelledError as TemporalCancelledError
from temporalio.service import RPCError, RPCStatusCode

from baton import temporal_ui
from baton.agents import registry
from baton.contracts.activity_io import ResumePoint
from baton.contracts.codes import (
    INVALID_PROMPT,
    QUEUE_FULL,
    SESSION_BUSY,
    SESSION_CLOSED,
    SESSION_EXTERNAL,
)
from baton.contracts.search import (
    eval_search_attributes,
    initial_search_attributes,
    step_search_attributes,
)
from baton.contracts.values import CLOSED_STATUSES, ResolvedAgent, TeamSnapshot
from baton.contracts.workflow_io import (
    EvalInput,
    IfBusy,
    Provenance,
    SessionConfig,
    SessionInput,
    StepInput,
    TurnOutcome,
    UserMessage,
)
from baton.errors import (
    BatonError,
    EngineUnavailable,
    InvalidPrompt,
    QueueFull,
    SessionBusy,
    SessionClosed,
    SessionExternal,
    TurnCancelled,
    TurnFailed,
)
from baton.runs import inquiries, session_store
from baton.settings import DEFAULT_MESSAGE_SETTLE_S
from baton.storage.db import SessionRow, StepRow, session_scope

WORKFLOW = "Session"
UPDATE = "send_message"
#: First and longest pause (s) between deliveries of a message refused busy while the
#: stored status is idle; the pause doubles from the first to the longest.
IDLE_SETTLE_POLL_S = 0.05
IDLE_SETTLE_MAX_POLL_S = 0.5
#: Deliveries of one Update: to the running run, then (its run completed, maybe just as
#: the Update arrived) by update-with-start, twice at most.
RESTART_ATTEMPTS = 3
#: Times a cancel starts a session's next run again when its run completed idle just as
#: the cancel arrived (a cancel of a closed run is a no-op in Temporal, not an error).
CANCEL_ATTEMPTS = 3

T = TypeVar("T")


@dataclass(frozen=True)
class Launched:
    """A started session: its id, pin and (sync) the final assistant message."""

    session_id: str
    agent: str
    version: int
    outcome: TurnOutcome | None
    response: str | None


def _name(prompt: str) -> str:
    line = prompt.strip().splitlines()[0] if prompt.strip() else ""
    return session_store.summarise(line, 80)


def refusal(exc: WorkflowUpdateFailedError) -> tuple[str | None, str]:
    """An Update's failure as ``(type, message)``: the workflow's ApplicationError type
    (``session_busy``, ``not_external``, …; None for any other failure) and its message."""
    cause = exc.cause
    if isinstance(cause, ApplicationError):
        return cause.type, str(cause.message)
    return None, str(cause)


def _update_error(exc: WorkflowUpdateFailedError, session_id: str) -> BatonError:
    kind, message = refusal(exc)
    cause = exc.cause
    if kind == SESSION_BUSY:
        return SessionBusy(message, session_id=session_id)
    if kind == QUEUE_FULL:
        return QueueFull(message, session_id=session_id)
    if kind == SESSION_CLOSED:
        return SessionClosed(message, session_id=session_id)
    if kind == INVALID_PROMPT:
        return InvalidPrompt(message, path="prompt")
    if kind == SESSION_EXTERNAL:  # no model turn runs in an external session
        return SessionExternal(message, session_id=session_id)
    link: BaseException | None = cause
    while link is not None:  # the workflow's cancel fails the turn, maybe via an activity
        if isinstance(link, TemporalCancelledError):
            return TurnCancelled(message, session_id=session_id)
        link = link.cause if isinstance(link, FailureError) else None
    return TurnFailed(message, session_id=session_id)


async def reply_text(engine: Engine, outcome: TurnOutcome | None) -> str | None:
    """The final reply's text: the preview when it is whole, else read from the DB."""
    if outcome is None:
        return None
    if outcome.preview_is_full:
        return outcome.preview
    return await asyncio.to_thread(final_text, engine, outcome.message_id)


def final_text(engine: Engine, message_id: str) -> str:
    """Full text of a stored message (claim-check: history holds only its id)."""
    with session_scope(engine) as s:
        row = session_store.get_message(s, message_id=message_id)
        return row.text if row else ""


@dataclass
class Recorded:
    """A session row recorded for a launch (:func:`record_session`): its pin, and the
    snapshot its first run carries (None: the workflow's ``load_agent`` resolves the pin)."""

    session_id: str
    slug: str
    version: int
    snapshot: ResolvedAgent | None


def record_session(
    s: Session,
    *,
    session_id: str,
    ref: str,
    prompt: str,
    provenance: Provenance,
    name: str | None = None,
    idempotent: bool = False,
    agent: ResolvedAgent | None = None,
    resolved: ResolvedAgent | None = None,
) -> Recorded:
    """Record the session row of a launch in the caller's transaction ``s`` (the API does
    it in the transaction that checked the request: one transaction, one resolution).

    ``agent``: see :func:`launch_session`; ``resolved``: ``ref`` as the caller has just
    resolved it (not resolved again). An ``idempotent`` launch whose row
    exists (a retried delegation) returns it unchanged. Raises what the registry raises
    for ``ref`` (AgentNotFound, AgentRetired, …) when it resolves it.
    """
    existing = s.get(SessionRow, session_id) if idempotent else None
    if existing is not None:
        # A retried launch: a start still to come runs what the first attempt was
        # given, or loads its pin (the workflow's `load_agent`).
        return Recorded(session_id, existing.agent_slug, existing.agent_version, agent)
    snapshot = agent or resolved or registry.resolve_agent(s, ref=ref)
    row = session_store.create_session(
        s,
        session_id=session_id,
        agent_slug=snapshot.slug,
        agent_version=snapshot.version,
        provenance=provenance,
        name=name or _name(prompt),
    )
    if snapshot.mcp_servers and agent is None:
        # MCP tools are discovered by the worker's `load_agent` (it reaches the servers;
        # the API need not): the workflow loads this pin itself.
        return Recorded(session_id, snapshot.slug, snapshot.version, None)
    row.resolved_agent = snapshot.model_dump(mode="json")
    s.add(row)
    return Recorded(session_id, snapshot.slug, snapshot.version, snapshot)


def new_session_id() -> str:
    """A new session's id (its workflow id)."""
    return f"session-{uuid.uuid4()}"


async def launch_session(
    client: Client,
    engine: Engine,
    *,
    task_queue: str,
    config: SessionConfig,
    ref: str,
    prompt: str,
    provenance: Provenance,
    sync: bool,
    name: str | None = None,
    session_id: str | None = None,
    update_id: str | None = None,
    agent: ResolvedAgent | None = None,
    team: TeamSnapshot | None = None,
    recorded: Recorded | None = None,
    keyed: bool = False,
    turn: int = 0,
    in_transcript: bool = False,
) -> Launched:
    """Resolve ``ref``, record the session and start it with its first message.

    ``turn``: the turn the session's transcript already reaches (a fork's prefix: its
    first turn is the next one); ``in_transcript``: the first message is the prefix's last
    (answered, not stored again).

    ``agent`` runs a given configuration instead of resolving ``ref`` (a subagent
    node: its pin overlaid with node-local instructions, model and tools); ``team``
    makes it a team run (the supervisor's session, members pinned); ``recorded``: the
    row the caller recorded itself in its own transaction (:func:`record_session`).

    ``session_id`` + ``update_id`` make the launch idempotent (the ``delegate``
    activity derives both from the delegation id, so a retry attaches to the
    session and message its first attempt started). ``keyed``: the caller derived the
    recorded session's id from an HTTP ``Idempotency-Key``, so a start that finds the
    workflow already running attaches to it and to its first message (a retry taking
    over a request whose API process was killed), as an idempotent launch does.

    Raises the registry's AgentNotFound / RevisionNotFound / AgentRetired /
    AgentNotPublished / InvalidReference, EngineUnavailable (Temporal refused the
    start; nothing is left behind) or TurnFailed (sync, the first turn failed).
    """
    idempotent = session_id is not None and recorded is None
    if recorded is None:
        record = functools.partial(
            record_session,
            session_id=session_id or new_session_id(),
            ref=ref,
            prompt=prompt,
            provenance=provenance,
            name=name,
            idempotent=idempotent,
            agent=agent,
        )
        recorded = await asyncio.to_thread(_in_transaction, engine, record)
    inp = _session_input(recorded, provenance=provenance, config=config, team=team, turn=turn)
    start = _start_operation(
        client,
        inp,
        task_queue=task_queue,
        name=name or _name(prompt),
        attach=idempotent or keyed,
    )
    first = UserMessage(
        prompt=prompt,
        invoked_by_agent=provenance.invoked_by_agent,
        user=provenance.created_by_user,
        in_transcript=in_transcript,
    )
    outcome = await _start_with_message(
        client,
        engine,
        start,
        first,
        session_id=inp.session_id,
        sync=sync,
        update_id=update_id or f"{inp.session_id}:message-1",
        keep_row=idempotent,
    )
    response = await reply_text(engine, outcome)
    return Launched(recorded.session_id, recorded.slug, recorded.version, outcome, response)


def _in_transaction(engine: Engine, fn: Callable[[Session], T]) -> T:
    """``fn`` in a transaction of its own."""
    with session_scope(engine) as s:
        return fn(s)


def _session_input(
    recorded: Recorded,
    *,
    provenance: Provenance,
    config: SessionConfig,
    team: TeamSnapshot | None,
    turn: int,
) -> SessionInput:
    """The first run's input for the session ``recorded`` describes."""
    return SessionInput(
        session_id=recorded.session_id,
        agent_pin=f"{recorded.slug}@{recorded.version}",
        provenance=provenance,
        config=config,
        # The snapshot goes in the input: the first workflow task schedules the first
        # model turn at once, with no `load_agent`. It is what `load_agent`
        # would resolve and record: the same pin, resolved in the same way.
        agent=recorded.snapshot,
        team=team,
        turn=turn,
    )


def _start_operation(
    client: Client, inp: SessionInput, *, task_queue: str, name: str, attach: bool
) -> WithStartWorkflowOperation[Any, Any]:
    """The start of the session's first run; ``attach``: a start that finds the workflow
    running uses it (an idempotent or keyed launch) instead of failing."""
    return WithStartWorkflowOperation(
        WORKFLOW,
        inp,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING
        if attach
        else WorkflowIDConflictPolicy.FAIL,
        # A retried delegation must never start the id again once its session closed.
        id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        **_start_options(inp, task_queue=task_queue, name=name, namespace=client.namespace),
    )


async def _start_with_message(
    client: Client,
    engine: Engine,
    start: WithStartWorkflowOperation[Any, Any],
    message: UserMessage,
    *,
    session_id: str,
    sync: bool,
    update_id: str,
    keep_row: bool,
) -> TurnOutcome | None:
    """Start the run with its first message by update-with-start: the turn's outcome
    (``sync``) or None once the Update is accepted. A refused Update raises its error, a
    refused start what :func:`_start_refused` decides (``keep_row``: the row stays)."""
    try:
        handle = await client.start_update_with_start_workflow(
            UPDATE,
            message,
            start_workflow_operation=start,
            wait_for_stage=WorkflowUpdateStage.COMPLETED if sync else WorkflowUpdateStage.ACCEPTED,
            id=update_id,
            result_type=TurnOutcome,
        )
        return await handle.result() if sync else None
    except WorkflowUpdateFailedError as exc:
        raise _update_error(exc, session_id) from exc
    except RPCError as exc:
        error = await _start_refused(client, engine, exc, session_id, keep_row=keep_row)
        raise error from exc


async def _start_refused(
    client: Client, engine: Engine, exc: RPCError, session_id: str, *, keep_row: bool
) -> BatonError:
    """What a launch whose start-with-Update Temporal refused raises, by the state of the
    workflow: still running, EngineUnavailable (the server aborted the Update under load;
    the caller retries with the same update id); ended, TurnFailed (the row stays, the
    transcript says what happened); never started, EngineUnavailable after deleting the
    row (unless ``keep_row``: an idempotent launch keeps it for its retry)."""
    running = await _running(client, session_id)
    if running:
        return EngineUnavailable(
            f"Temporal aborted the message, the session is still running: {exc.message}"
        )
    if running is not None:
        return TurnFailed(f"the session ended: {exc.message}", session_id=session_id)
    if not keep_row:
        await asyncio.to_thread(forget_session, engine, session_id)
    return EngineUnavailable(
        f"Temporal refused to start the session: {exc.message}{_setup_hint(exc)}"
    )


def _setup_hint(exc: RPCError) -> str:
    """What to do when Temporal refuses a start for an unregistered search attribute (a
    namespace set up by an older Baton lacks BatonRoot and BatonKind)."""
    if "search attribute" in (exc.message or ""):
        return " (run `baton setup` to register search attributes)"
    return ""


def _start_options(
    inp: SessionInput, *, task_queue: str, name: str, namespace: str
) -> dict[str, Any]:
    """The start options every run of a session gets (its first and each restart):
    id, queue, search attributes, the UI's static summary and details (the
    markdown links to the parent, the root and the run tree)."""
    pin = inp.agent_pin
    return {
        "id": inp.session_id,
        "task_queue": task_queue,
        "search_attributes": initial_search_attributes(inp),
        "static_summary": f"{pin} · {name}",
        "static_details": temporal_ui.session_details(
            namespace=namespace, session_id=inp.session_id, pin=pin, provenance=inp.provenance
        ),
    }


def _resume_point(engine: Engine, session_id: str) -> tuple[ResumePoint, str]:
    with session_scope(engine) as s:
        return session_store.resume_input(s, session_id=session_id)


def _restart_options(point: ResumePoint, name: str, namespace: str) -> dict[str, Any]:
    """Start options of a session's next run: the same workflow id, attaching to a run
    another sender started meanwhile (USE_EXISTING), and allowed although a run of that
    id completed before (ALLOW_DUPLICATE). Closed sessions never get here: their status
    is checked in the DB first (:func:`baton.runs.session_store.resume_input`)."""
    return {
        "id_conflict_policy": WorkflowIDConflictPolicy.USE_EXISTING,
        "id_reuse_policy": WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        **_start_options(point.input, task_queue=point.task_queue, name=name, namespace=namespace),
    }


async def deliver_update(
    client: Client,
    engine: Engine,
    *,
    session_id: str,
    update: str,
    arg: Any,
    update_id: str,
    wait_for_stage: WorkflowUpdateStage,
    result_type: type[T],
) -> WorkflowUpdateHandle[T]:
    """Start Update ``update`` (``arg``, id ``update_id``) on the session's workflow; when
    its run has completed idle, start the next run with it.

    The one road by which anything that needs a turn reaches a session: messages
    (API, ``baton`` CLI, delegations reusing a session) and an external session's MCP
    calls. A running run takes the Update as before. A run that completed idle
    answers NOT_FOUND; the next run then starts from the resume point in the DB
    (:func:`baton.runs.session_store.resume_input`) by update-with-start, so the Update lands
    in its first workflow task, and two senders racing to restart it land in one run
    (USE_EXISTING; the second may be refused ``session_busy``, as for any run). An
    Update that reaches a run while its completing workflow task is in flight is
    aborted by Temporal when the run closes (NOT_FOUND, never accepted): it is sent
    again the same way. An ``update_id`` the completed run already finished is
    answered with that outcome by Temporal, not run again (a retried delegation).

    Raises SessionNotFound; SessionClosed when the session is closed or its run ended
    without a resume point; WorkflowUpdateFailedError (validator or handler) and
    RPCError (Temporal refused) as ``start_update`` does.
    """
    handle = client.get_workflow_handle(session_id)
    for attempt in range(1, RESTART_ATTEMPTS + 1):
        try:
            if attempt == 1:
                return await handle.start_update(
                    update,
                    arg,
                    id=update_id,
                    wait_for_stage=wait_for_stage,
                    result_type=result_type,
                )
            point, name = await asyncio.to_thread(_resume_point, engine, session_id)
            start: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
                WORKFLOW, point.input, **_restart_options(point, name, client.namespace)
            )
            return await client.start_update_with_start_workflow(
                update,
                arg,
                start_workflow_operation=start,
                id=update_id,
                wait_for_stage=wait_for_stage,
                result_type=result_type,
            )
        except RPCError as exc:
            # NOT_FOUND: the run had completed ("workflow execution already completed"),
            # or completed while this Update waited to be delivered ("workflow update was
            # aborted by closing workflow": never accepted, so sending it again is safe).
            if exc.status != RPCStatusCode.NOT_FOUND or attempt == RESTART_ATTEMPTS:
                raise
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def accepted_status(*, sync: bool) -> str:
    """The status a session has once a launch or a message was delivered, from what the
    delivery returned (never read back from the DB): ``idle`` after a ``sync`` call (its
    turn ran to its final reply), ``running`` after an async one (the Update was accepted:
    its turn runs now)."""
    return "idle" if sync else "running"


def session_status(engine: Engine, session_id: str) -> str:
    """The stored status of ``session_id``. Raises SessionNotFound."""
    with session_scope(engine) as s:
        return session_store.get_session(s, session_id=session_id).status


async def _running(client: Client, session_id: str) -> bool | None:
    """Whether the session's workflow is running; None when it never started."""
    try:
        desc = await client.get_workflow_handle(session_id).describe()
    except RPCError:
        return None
    return desc.status == WorkflowExecutionStatus.RUNNING


def forget_session(engine: Engine, session_id: str) -> None:
    """Delete the row of a session recorded but never started (Temporal refused the start,
    or could not be reached): nothing of a failed launch is left behind."""
    with session_scope(engine) as s:
        row = s.get(SessionRow, session_id)
        if row is not None:
            s.delete(row)


def _mark_running(engine: Engine, session_id: str) -> bool:
    """Mark an idle session running before its message's Update, so that an SSE client
    following ``until=idle`` right after the send never sees the previous turn's idle
    state. Returns whether it marked it; raises SessionClosed for a closed session."""
    with session_scope(engine) as s:
        row = session_store.get_session(s, session_id=session_id)
        if row.status in CLOSED_STATUSES:
            raise SessionClosed(f"session '{session_id}' is {row.status}")
        if row.status != "idle":
            return False
        session_store.set_status(s, session_id=session_id, status="running")
        return True


def _restore_idle(engine: Engine, session_id: str) -> None:
    """Undo :func:`_mark_running` for a message that was not delivered."""
    with session_scope(engine) as s:
        session_store.set_status(s, session_id=session_id, status="idle")


async def _deliver_settling(
    deliver: Callable[[], Awaitable[TurnOutcome | None]],
    engine: Engine,
    *,
    session_id: str,
    marked: bool,
    settle_s: float,
) -> TurnOutcome | None:
    """``deliver()``, again while the workflow refuses it ``session_busy`` but the stored
    status says idle (``marked``: this send saw it idle), pausing 50 ms doubling to 0.5 s,
    for up to ``settle_s`` seconds. Any other failure, or busy past that, is raised.

    The stored status turns idle when the last reply is stored, before the workflow ends
    the turn: a message sent in between is rejected busy. The gap is a moment, or the
    sticky timeout when the worker that ran the turn was killed (the Update then rides
    the task that ends the turn, and its validator runs first). A rejected Update leaves
    no trace, so delivering again is safe.
    """
    deadline = asyncio.get_running_loop().time() + settle_s
    pause = IDLE_SETTLE_POLL_S
    while True:
        try:
            return await deliver()
        except WorkflowUpdateFailedError as exc:
            busy = isinstance(exc.cause, ApplicationError) and exc.cause.type == SESSION_BUSY
            if not busy or asyncio.get_running_loop().time() > deadline:
                raise
            if not marked and await asyncio.to_thread(session_status, engine, session_id) != "idle":
                raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, IDLE_SETTLE_MAX_POLL_S)


async def send_message(
    client: Client,
    engine: Engine,
    *,
    session_id: str,
    prompt: str,
    sync: bool,
    update_id: str | None = None,
    invoked_by_agent: str | None = None,
    user: str | None = None,
    settle_s: float = DEFAULT_MESSAGE_SETTLE_S,
    if_busy: IfBusy = "reject",
) -> tuple[TurnOutcome | None, str | None]:
    """Send a message to an existing session: ``(outcome, final text)`` when sync.

    ``update_id`` makes the send idempotent (delegations); ``invoked_by_agent``
    marks the turn as invoked by that agent (the one-hop rule applies to it);
    ``user`` is the sender, whose roles that turn's X-Agent calls use (auth mode);
    ``if_busy``: what a message sent while a turn runs asks for (:mod:`workflows.inbox`).

    What the API calls idle it never refuses as busy: a message the workflow refuses
    ``session_busy`` while the stored status says idle (the last turn stored its reply;
    the workflow task that ends the turn is still to run, e.g. on a killed worker's
    sticky queue) is delivered again, pausing 50 ms doubling to 0.5 s, for up to
    ``settle_s`` seconds from the first delivery (``BATON_MESSAGE_SETTLE_TIMEOUT``).

    Raises SessionNotFound, SessionBusy (409, a turn is running), QueueFull, SessionClosed,
    InvalidPrompt, TurnFailed or EngineUnavailable.
    """

    # A sync caller waits for the reply itself: no SSE race to close, so skip the write.
    # An idempotent (delegation) send may be a retry of an Update that already finished:
    # marking the session running then would leave it running with no turn to end it.
    marked = (
        False if sync or update_id else await asyncio.to_thread(_mark_running, engine, session_id)
    )
    message_id = update_id or f"{session_id}:message-{uuid.uuid4()}"

    async def deliver() -> TurnOutcome | None:
        update = await deliver_update(
            client,
            engine,
            session_id=session_id,
            update=UPDATE,
            arg=UserMessage(
                prompt=prompt, invoked_by_agent=invoked_by_agent, user=user, if_busy=if_busy
            ),
            update_id=message_id,
            wait_for_stage=WorkflowUpdateStage.COMPLETED if sync else WorkflowUpdateStage.ACCEPTED,
            result_type=TurnOutcome,
        )
        # A validator rejection (busy, closed, blank) comes back with the acceptance
        # response as an already-known outcome; reading it raises it. Without this an
        # async message sent during a turn would be answered 200 and silently dropped.
        settled = getattr(update, "_known_outcome", None) is not None
        return await update.result() if sync or settled else None

    try:
        outcome = await _deliver_settling(
            deliver, engine, session_id=session_id, marked=marked, settle_s=settle_s
        )
    except WorkflowUpdateFailedError as exc:
        error = _update_error(exc, session_id)
        if marked and not isinstance(error, TurnFailed):
            await asyncio.to_thread(_restore_idle, engine, session_id)
        raise error from exc
    except RPCError as exc:
        if marked:
            await asyncio.to_thread(_restore_idle, engine, session_id)
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise SessionClosed(f"session '{session_id}' is no longer running") from exc
        raise EngineUnavailable(f"Temporal refused the message: {exc.message}") from exc
    except SessionClosed:  # its run ended and it has no resume point
        if marked:
            await asyncio.to_thread(_restore_idle, engine, session_id)
        raise
    text = await reply_text(engine, outcome)
    return outcome, text


async def cancel_session(client: Client, engine: Engine, *, session_id: str) -> None:
    """Request cancellation; the workflow records ``cancelled``, cancels the sessions
    delegated from it, and ends. Idempotent. Raises EngineUnavailable.

    Temporal takes a cancel of a run that has ended as a no-op, so the run is described
    after the cancel: when it had completed idle (or is gone), the session's next run
    is started from its resume point and cancelled, so every cancel takes the
    workflow's one cancel path (status, cascade). A session with no resume point whose
    run ended otherwise (terminated before it ever completed idle) is left as it is.
    """

    if await asyncio.to_thread(session_status, engine, session_id) in CLOSED_STATUSES:
        return
    handle: WorkflowHandle[Any, Any] = client.get_workflow_handle(session_id)
    for attempt in range(1, CANCEL_ATTEMPTS + 1):
        try:
            await handle.cancel()
            status: WorkflowExecutionStatus | None = (await handle.describe()).status
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise EngineUnavailable(f"Temporal refused the cancel: {exc.message}") from exc
            status = None  # no run at all: gone after the namespace's retention period
        if status in (WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CANCELED):
            return  # a running run has the cancel in its history and will honour it
        try:
            point, name = await asyncio.to_thread(_resume_point, engine, session_id)
        except SessionClosed:
            return
        if attempt == CANCEL_ATTEMPTS:
            msg = f"session '{session_id}': its run kept completing before the cancel reached it"
            raise EngineUnavailable(msg)
        try:
            handle = await client.start_workflow(
                WORKFLOW, point.input, **_restart_options(point, name, client.namespace)
            )
        except RPCError as exc:
            raise EngineUnavailable(f"Temporal refused the cancel: {exc.message}") from exc


STEP_WORKFLOW = "AgentStep"


def _attach_if_keyed(keyed: bool) -> dict[str, Any]:
    """The id policies of a start whose id may derive from an ``Idempotency-Key``: a keyed
    retry attaches to the run its first attempt started, even one that has finished since
    (never a second run); an unkeyed start takes the server's defaults."""
    if keyed:
        return {
            "id_conflict_policy": WorkflowIDConflictPolicy.USE_EXISTING,
            "id_reuse_policy": WorkflowIDReusePolicy.REJECT_DUPLICATE,
        }
    return {
        "id_conflict_policy": WorkflowIDConflictPolicy.UNSPECIFIED,
        "id_reuse_policy": WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    }


def record_step(
    session: Session,
    *,
    inp: StepInput,
    ref: str,
    keyed: bool = False,
    provenance: Provenance | None = None,
    agent: ResolvedAgent | None = None,
) -> tuple[str, int]:
    """Resolve ``ref`` to a pin and record the step (its row and the session row of the same
    id that holds its transcript) in ``session`` (flush only). Returns ``(slug, version)``.
    ``keyed`` (the step id derived from an ``Idempotency-Key``): a step already stored
    under that id is a first attempt's, and its pin is returned unchanged.

    ``provenance`` goes on the transcript's session row (an eval's step replay: its
    ``eval_id`` and ``replay_of`` keep it out of ``GET /v1/steps``); ``agent`` runs a given
    snapshot instead of resolving ``ref`` (the draft, version 0, in an eval's sandbox): it
    is recorded on that row, where ``load_agent`` reads a version-0 snapshot.

    Raises the registry's errors for the reference and NotInvocable (422
    ``not_invocable``) for an ambassador, which never runs as a step
    (:func:`baton.runs.inquiries.require_invocable`, the sessions' rule).
    """
    existing = session.get(StepRow, inp.step_id) if keyed else None
    if existing is not None:
        return existing.agent_slug, existing.agent_version
    if agent is not None:
        slug, version = agent.slug, agent.version
    else:
        found, rev = registry.resolve_ref(session, ref=ref)
        slug, version = found.slug, rev.version
    inquiries.require_invocable(session, slug=slug)
    session.add(
        StepRow(
            id=inp.step_id,
            agent_slug=slug,
            agent_version=version,
            input=inp.input,
            output_schema=inp.output_schema,
            retry=inp.retry.model_dump(),
            handoff=inp.handoff,
            timeout_s=inp.timeout_s,
            created_by_user=inp.user,
        )
    )
    # The step's transcript lives in a session row of the same id (claim-check).
    row = session_store.create_session(
        session,
        session_id=inp.step_id,
        agent_slug=slug,
        agent_version=version,
        provenance=provenance or Provenance(created_by_user=inp.user),
        name=f"Step · {_name(inp.input)}",
    )
    if agent is not None:
        row.resolved_agent = agent.model_dump(mode="json")
        session.add(row)
    return slug, version


def forget_step(engine: Engine, step_id: str) -> None:
    """Delete the rows of a step recorded but never started: nothing is left behind."""
    with session_scope(engine) as s:
        for model in (StepRow, SessionRow):
            row = s.get(model, step_id)
            if row is not None:
                s.delete(row)


async def launch_step(
    client: Client,
    engine: Engine,
    *,
    task_queue: str,
    inp: StepInput,
    ref: str,
    recorded: tuple[str, int] | None = None,
    keyed: bool = False,
    provenance: Provenance | None = None,
    agent: ResolvedAgent | None = None,
) -> tuple[str, int]:
    """Record the step (:func:`record_step`, ``provenance`` and ``agent`` as there) and
    start its AgentStepWorkflow (id ``step-<uuid>``). Returns ``(slug, version)``.
    ``recorded``: what the caller's own :func:`record_step` returned (the API records
    before it connects to Temporal).

    ``keyed``: the step id was derived from an HTTP ``Idempotency-Key``; a stored step of
    that id is a first attempt's (its API process killed): its pin is kept and its
    workflow, once started, attached to, never started twice.

    Raises what :func:`record_step` raises, EngineUnavailable when Temporal refuses the
    start (nothing is left behind).
    """

    def record() -> tuple[str, int]:
        with session_scope(engine) as s:
            return record_step(s, inp=inp, ref=ref, keyed=keyed, provenance=provenance, agent=agent)

    slug, version = recorded if recorded is not None else await asyncio.to_thread(record)
    pinned = inp.model_copy(update={"agent_pin": f"{slug}@{version}"})
    try:
        await client.start_workflow(
            STEP_WORKFLOW,
            pinned,
            id=inp.step_id,
            task_queue=task_queue,
            search_attributes=step_search_attributes(pinned),
            static_summary=f"step {slug}@{version} · {_name(inp.input)}",
            static_details=temporal_ui.step_details(
                namespace=client.namespace,
                step_id=inp.step_id,
                pin=pinned.agent_pin,
                user=inp.user,
                handoff=inp.handoff,
            ),
            **_attach_if_keyed(keyed),
        )
    except WorkflowAlreadyStartedError:
        if not keyed:
            raise
    except RPCError as exc:
        await asyncio.to_thread(forget_step, engine, inp.step_id)
        raise EngineUnavailable(
            f"Temporal refused to start the step: {exc.message}{_setup_hint(exc)}"
        ) from exc
    return slug, version


EVAL_WORKFLOW = "Eval"


async def launch_eval(
    client: Client,
    *,
    task_queue: str,
    inp: EvalInput,
    slug: str,
    owner: str,
    summary: str,
    keyed: bool = False,
) -> None:
    """Start the Eval workflow of a recorded eval (id: the eval id). ``keyed``: the id was
    derived from an HTTP ``Idempotency-Key``, so a retry attaches to the eval its first
    attempt started, never starting a second one. Raises EngineUnavailable when Temporal
    refuses the start (the caller forgets the row it recorded)."""
    try:
        await client.start_workflow(
            EVAL_WORKFLOW,
            inp,
            id=inp.eval_id,
            task_queue=task_queue,
            search_attributes=eval_search_attributes(slug, owner),
            static_summary=summary,
            **_attach_if_keyed(keyed),
        )
    except WorkflowAlreadyStartedError:
        if not keyed:
            raise
    except RPCError as exc:
        raise EngineUnavailable(f"Temporal refused the eval: {exc.message}") from exc


async def cancel_run(client: Client, *, workflow_id: str) -> None:
    """Request cancellation of a run that is not a session (sessions take
    :func:`cancel_session`, which restarts an idle-completed one to cancel it): an Eval
    workflow, which cancels its replays in flight through its activities, or an eval's
    step replay. Idempotent: a cancel of an ended or unknown run is a no-op. Raises
    EngineUnavailable."""
    try:
        await client.get_workflow_handle(workflow_id).cancel()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return
        raise EngineUnavailable(f"Temporal refused the cancel: {exc.message}") from exc
