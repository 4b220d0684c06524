"""``/v1/steps``, ``/v1/usage``, ``/v1/balance``: workflow-agent steps, metering and the
balance ceiling (docs/steps.md, docs/metering.md)."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, status
from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, field_validator
from sqlalchemy.engine import Engine
from sqlmodel import col
from temporalio.service import RPCError

from api.deps import CallerDep, EngineDep, SessionDep, SettingsDep, TemporalDep
from api.idempotency import IDEMPOTENT, IdempotencyDep
from api.problems import problem_responses
from baton.agents.schemas import MAX_OFFSET, Page
from baton.agents.spec import REF_PATTERN, SafeText, parse_ref
from baton.contracts.workflow_io import HandoffDecision, StepInput, StepRetry
from baton.errors import AdminOnly, Conflict, EngineUnavailable, NotFound
from baton.evals import replay
from baton.runs import deliverables, launch, metering, session_store
from baton.runs.deliverables import check_output_schema
from baton.runs.handoff import status_after
from baton.storage.db import StepRow, page, session_scope

router = APIRouter(prefix="/v1/steps", tags=["steps"])
usage_router = APIRouter(prefix="/v1", tags=["usage"])

StepIdPath = Annotated[str, Path(pattern=r"^step-[0-9a-f-]{36}$", examples=["step-1c9e…"])]
#: Largest input (characters) and schema (bytes of JSON) a step accepts.
MAX_INPUT_CHARS = 64_000
MAX_SCHEMA_BYTES = 64_000


class StepNotFound(NotFound):
    """No step with this id."""

    code = "step_not_found"


class NotAwaitingHandoff(Conflict):
    """A handoff decision for a step that is not waiting for one."""

    code = "step_not_awaiting_handoff"


class StepCreate(BaseModel):
    """``POST /v1/steps``. A bare slug is compiled to a pin at launch and recorded."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,  # no `"handoff": 1` or `"timeout_s": "60"` coercions
        json_schema_extra={
            "examples": [
                {
                    "agent": "writer",
                    "input": "Summarise the Q3 report.",
                    "output_schema": {
                        "type": "object",
                        "properties": {"summary": {"type": "string"}},
                        "required": ["summary"],
                    },
                    "retry": {"max_attempts": 3, "initial_interval_s": 1, "backoff_coefficient": 2},
                    "handoff": True,
                }
            ]
        },
    )

    agent: str = Field(pattern=REF_PATTERN, description="`slug` (compiled to a pin) or `slug@v`.")
    input: SafeText | dict[str, Any] | list[Any] = Field(
        description="Text, or JSON (sent to the model as JSON text)."
    )
    output_schema: dict[str, Any] | None = Field(
        default=None, description="JSON Schema (2020-12) the deliverable must validate against."
    )
    retry: StepRetry = Field(default_factory=StepRetry)
    handoff: bool = Field(
        default=False, description="Wait for a human's approval (Signal handoff)."
    )
    timeout_s: float | None = Field(default=None, gt=0, le=7 * 86400, allow_inf_nan=False)
    handoff_timeout_s: float = Field(default=86_400.0, gt=0, le=30 * 86400, allow_inf_nan=False)

    @field_validator("output_schema")
    @classmethod
    def _schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return value
        if len(json.dumps(value)) > MAX_SCHEMA_BYTES:
            raise ValueError(f"output_schema is larger than {MAX_SCHEMA_BYTES} bytes")
        return value

    @field_validator("input")
    @classmethod
    def _input(cls, value: str | dict[str, Any] | list[Any]) -> str | dict[str, Any] | list[Any]:
        text = value if isinstance(value, str) else json.dumps(value)
        if not text.strip() or len(text) > MAX_INPUT_CHARS:
            raise ValueError(f"input must be 1..{MAX_INPUT_CHARS} characters and not blank")
        return value


_NUMBER = re.compile(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*")


def _no_bare_number(value: Any) -> Any:
    """Refuse a number where a date-time is expected (pydantic reads ``0.5`` as a Unix time)."""
    if isinstance(value, int | float) or (isinstance(value, str) and _NUMBER.fullmatch(value)):
        raise ValueError("expected an RFC 3339 date-time with a timezone, not a number")
    return value


#: A query date-time: RFC 3339 with a timezone (``2026-12-01T10:00:00Z``); no Unix numbers.
IsoDateTime = Annotated[AwareDatetime, BeforeValidator(_no_bare_number)]


class StepAccepted(BaseModel):
    """``202`` for a launched step."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"step_id": "step-1c9e…", "agent": "writer", "version": 3, "status": "running"}
            ]
        }
    )

    step_id: str
    agent: str
    version: int
    status: str


class StepPublic(BaseModel):
    """``GET /v1/steps/{id}``."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "step_id": "step-1c9e…",
                    "agent": "writer",
                    "version": 3,
                    "status": "completed",
                    "deliverable": {"summary": "Revenue grew 4%."},
                    "attempts": 2,
                    "error": None,
                    "handoff": False,
                    "created_at": "2026-11-29T12:00:00Z",
                    "updated_at": "2026-11-29T12:00:05Z",
                }
            ]
        }
    )

    step_id: str
    agent: str
    version: int
    status: str
    deliverable: Any
    attempts: int
    error: str | None
    handoff: bool
    created_at: datetime
    updated_at: datetime


def step_public(row: StepRow) -> StepPublic:
    """The API view of a step row (also the console's)."""
    return StepPublic(
        step_id=row.id,
        agent=row.agent_slug,
        version=row.agent_version,
        status=row.status,
        deliverable=row.deliverable,
        attempts=row.attempts,
        error=row.error,
        handoff=row.handoff,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    responses=problem_responses(403, 404, 409, 422, 503),
    summary="Run an agent as a workflow-agent step",
)
async def create_step(
    body: StepCreate,
    engine: EngineDep,
    settings: SettingsDep,
    caller: CallerDep,
    temporal: TemporalDep,
    claim: IdempotencyDep,
) -> StepAccepted:
    """Pin the agent, store the step and start its AgentStepWorkflow; poll GET for the result.

    422 ``not_invocable`` for an ambassador (it never runs as a step). Everything is
    checked before Temporal is reached: a bad request is its 4xx even while Temporal is
    down (503 ``engine_unavailable`` only for a valid one). With an ``Idempotency-Key``
    the step id is derived from it: a retry that takes over a request whose API process
    was killed attaches to the step it started.
    """
    if body.output_schema is not None:
        check_output_schema(body.output_schema)
    text = body.input if isinstance(body.input, str) else json.dumps(body.input)
    step_id = f"step-{claim.uuid() if claim else uuid.uuid4()}"
    inp = StepInput(
        step_id=step_id,
        agent_pin=body.agent,
        input=text,
        output_schema=body.output_schema,
        retry=body.retry,
        handoff=body.handoff,
        handoff_timeout_s=body.handoff_timeout_s,
        timeout_s=body.timeout_s,
        config=settings.session_config(),
        user=caller.user,
    )

    def record() -> tuple[tuple[str, int], bool]:
        with session_scope(engine) as s:
            caller.require(s, parse_ref(body.agent)[0], "user")
            # A keyed retry's step may be a killed first attempt's, its workflow running.
            existed = claim is not None and s.get(StepRow, step_id) is not None
            return launch.record_step(s, inp=inp, ref=body.agent, keyed=bool(claim)), existed

    recorded, existed = await asyncio.to_thread(record)
    try:
        client = await temporal.client()
    except EngineUnavailable:
        if not existed:
            await asyncio.to_thread(launch.forget_step, engine, step_id)
        raise
    slug, version = await launch.launch_step(
        client,
        engine,
        task_queue=settings.task_queue,
        inp=inp,
        ref=body.agent,
        recorded=recorded,
        keyed=bool(claim),
    )
    return StepAccepted(step_id=step_id, agent=slug, version=version, status="running")


@router.get("", responses=problem_responses(422), summary="List steps")
def list_steps(
    session: SessionDep,
    caller: CallerDep,
    agent: Annotated[str | None, Query(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Page[StepPublic]:
    """Steps newest first (auth mode: of agents the user holds a role on); an eval's step
    replays are never listed."""
    conditions: list[Any] = [col(StepRow.id).not_in(replay.replay_step_ids())]
    if agent is not None:
        conditions.append(col(StepRow.agent_slug) == agent)
    visible = caller.visible(session)
    if visible is not None:
        conditions.append(col(StepRow.agent_slug).in_(visible))
    newest_first = [col(StepRow.created_at).desc(), col(StepRow.id)]
    rows, total = page(
        session, StepRow, where=conditions, order_by=newest_first, limit=limit, offset=offset
    )
    return Page(data=[step_public(r) for r in rows], count=total)


def _get(session: Any, step_id: str) -> StepRow:
    row = session.get(StepRow, step_id)
    if row is None:
        raise StepNotFound(f"no step '{step_id}'")
    return row  # type: ignore[no-any-return]


@router.get("/{step_id}", responses=problem_responses(403, 404, 422), summary="Get a step")
def get_step(step_id: StepIdPath, session: SessionDep, caller: CallerDep) -> StepPublic:
    """Status, pin, deliverable, attempts, error."""
    row = _get(session, step_id)
    caller.require(session, row.agent_slug, "viewer")
    return step_public(row)


@router.post(
    "/{step_id}/handoff",
    status_code=status.HTTP_202_ACCEPTED,
    dependencies=IDEMPOTENT,
    responses=problem_responses(403, 404, 409, 422, 503),
    summary="Approve, revise or reject a step's deliverable",
)
async def handoff(
    step_id: StepIdPath,
    body: HandoffDecision,
    engine: EngineDep,
    caller: CallerDep,
    temporal: TemporalDep,
) -> StepPublic:
    """Deliver Signal ``handoff``; 409 ``step_not_awaiting_handoff`` unless it waits for one."""

    def load() -> StepPublic:
        with session_scope(engine) as s:
            row = _get(s, step_id)
            caller.require(s, row.agent_slug, "user")
            return step_public(row)

    step = await asyncio.to_thread(load)
    if step.status != "awaiting_handoff":
        raise NotAwaitingHandoff(
            f"step '{step_id}' is {step.status}, not awaiting_handoff", step_status=step.status
        )
    if body.edited_deliverable is not None:
        await asyncio.to_thread(_check_edit, engine, step_id, body)
    client = await temporal.client()
    try:
        await client.get_workflow_handle(step_id).signal("handoff", body)
    except RPCError as exc:
        raise EngineUnavailable(f"Temporal refused the decision: {exc.message}") from exc
    return await _after_decision(step, body, load)


def _check_edit(engine: Engine, step_id: str, body: HandoffDecision) -> None:
    """422 ``invalid_deliverable`` unless ``body``'s edit passes the step's
    ``output_schema`` (:func:`baton.runs.deliverables.check_edit`)."""
    with session_scope(engine) as s:
        schema = _get(s, step_id).output_schema
    deliverables.check_edit(body, schema)


#: Seconds the handoff reply waits for the step row to show the decision applied.
HANDOFF_APPLIED_WAIT_S = 5.0


async def _after_decision(before: StepPublic, decision: HandoffDecision, load: Any) -> StepPublic:
    """The step once the workflow has applied ``decision``: the row as
    it leaves ``awaiting_handoff``, polled for up to :data:`HANDOFF_APPLIED_WAIT_S`
    seconds; past that (a busy worker) the status the decision leads to, unstored yet."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HANDOFF_APPLIED_WAIT_S
    while loop.time() < deadline:
        await asyncio.sleep(0.05)
        now: StepPublic = await asyncio.to_thread(load)
        if now.status != "awaiting_handoff" or now.attempts != before.attempts:
            return now
    return before.model_copy(update={"status": status_after(decision)})


@router.get(
    "/{step_id}/transcript",
    responses=problem_responses(403, 404, 422),
    summary="A step's transcript",
)
def get_step_transcript(
    step_id: StepIdPath, session: SessionDep, caller: CallerDep
) -> session_store.Transcript:
    """Every attempt's messages, oldest first (revision prompts and schema feedback
    included): the step stores them under its own id."""
    row = _get(session, step_id)
    caller.require(session, row.agent_slug, "viewer")
    return session_store.transcript(session, session_id=step_id)


@usage_router.get("/usage", responses=problem_responses(422), summary="Metered usage")
def get_usage(
    session: SessionDep,
    caller: CallerDep,
    group_by: Annotated[
        metering.GroupBy, Query(description="agent | session | step | day | model")
    ] = "agent",
    agent: Annotated[str | None, Query(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")] = None,
    session_id: Annotated[str | None, Query(max_length=80)] = None,
    step_id: Annotated[str | None, Query(max_length=80)] = None,
    since: IsoDateTime | None = None,
    until: IsoDateTime | None = None,
) -> Page[metering.UsageGroup]:
    """Tokens in/out, requests and cost of every model call, summed per group (auth
    mode: only the model calls of agents the caller holds a role on)."""
    rows = metering.usage(
        session,
        group_by=group_by,
        agent=agent,
        session_id=session_id,
        step_id=step_id,
        since=since,
        until=until,
        agents=caller.visible(session),
    )
    return Page(data=rows, count=len(rows))


@usage_router.get("/balance", summary="The organisation balance")
def get_balance(session: SessionDep, _caller: CallerDep) -> metering.BalancePublic:
    """``{balance}`` in USD; null = unlimited; spent when ≤ 0."""
    return metering.BalancePublic(balance=metering.get_balance(session))


@usage_router.put("/balance", responses=problem_responses(403, 422), summary="Set the balance")
def put_balance(
    body: metering.BalanceUpdate, session: SessionDep, caller: CallerDep
) -> metering.BalancePublic:
    """Set the balance (USD; null = unlimited). Model calls are refused once it is ≤ 0.

    The balance is the whole organisation's spending ceiling, and auth mode has no
    organisation-wide role: there it is refused over the API (403 ``admin_only``) and
    set with the database-side ``baton balance set``, like ``baton users``.
    """
    if caller.auth:
        raise AdminOnly("the balance is set with `baton balance set` (BATON_AUTH=on)")
    metering.set_balance(session, amount=body.balance)
    session.commit()
    return metering.BalancePublic(balance=body.balance)
