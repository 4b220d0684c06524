"""``/v1/agents/{slug}/evals``: replays of an agent's recorded sessions on a candidate and
a baseline, and their comparison (docs/change-safely.md). In auth mode an eval is read
by its owner and the agent's owners; another user gets 404 ``eval_not_found``."""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, status
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy.engine import Engine
from sqlmodel import Session

from api.deps import Caller, CallerDep, EngineDep, SessionDep, SettingsDep, TemporalDep
from api.idempotency import IDEMPOTENT, IdempotencyDep
from api.problems import problem_responses
from api.routers.agents import SlugPath
from api.routers.sessions import runnable
from api.routers.steps import IsoDateTime
from baton.agents import registry
from baton.agents.schemas import MAX_OFFSET, Page
from baton.agents.spec import ModelName
from baton.contracts.evals import EVAL_ID_PATTERN, EvalReport, EvalSummary
from baton.contracts.values import ResolvedAgent
from baton.contracts.workflow_io import EvalInput
from baton.errors import BatonError, EngineUnavailable, NotFound
from baton.evals import judge, replay, store
from baton.runs import launch
from baton.settings import Settings
from baton.storage.db import EvalRow, session_scope, utcnow

router = APIRouter(prefix="/v1/agents", tags=["evals"])

EvalIdPath = Annotated[str, Path(pattern=EVAL_ID_PATTERN, examples=["eval-5f0c9a3e-…"])]


@router.get("/{slug}/evals", responses=problem_responses(404, 422), summary="List evals")
def list_evals(
    slug: SlugPath,
    session: SessionDep,
    caller: CallerDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> Page[EvalSummary]:
    """The agent's evals newest first, without their reports (auth mode: the caller's own,
    or all of them for an owner of the agent); 404 ``agent_not_found``."""
    caller.require(session, slug, "viewer")
    registry.get_agent(session, slug=slug)
    rows, total = store.list_evals(
        session, slug=slug, user=caller.acl_user, limit=limit, offset=offset
    )
    return Page(data=[store.eval_summary(r) for r in rows], count=total)


@router.get("/{slug}/evals/{eval_id}", responses=problem_responses(404, 422), summary="Get an eval")
def get_eval(
    slug: SlugPath, eval_id: EvalIdPath, session: SessionDep, caller: CallerDep
) -> EvalReport:
    """One eval with its report, partial while it runs (poll this for progress: ``done``
    of ``total``); 404 ``eval_not_found`` for no such eval, one of another agent, or
    (auth mode) another user's."""
    caller.require(session, slug, "viewer")
    row = store.get_eval(session, eval_id=eval_id, user=caller.acl_user, slug=slug)
    return store.eval_report(row)


#: ``draft`` (the agent's draft, in the sandbox), ``slug@draft`` or ``slug@V``.
CANDIDATE_PATTERN = r"^(draft|[a-z0-9][a-z0-9-]{0,62}@([1-9][0-9]{0,8}|draft))$"
#: ``live`` (the live revision when the eval starts) or ``slug@V``.
BASELINE_PATTERN = r"^(live|[a-z0-9][a-z0-9-]{0,62}@[1-9][0-9]{0,8})$"


class UnknownCandidate(BatonError):
    """The candidate or baseline names no revision (or draft) of the eval's agent."""

    code = "unknown_candidate"
    status = 422
    title = "Unknown candidate"


class EvalCreate(BaseModel):
    """``POST /v1/agents/{slug}/evals``."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"examples": [{"candidate": "draft", "sessions": 10}]},
    )

    candidate: str = Field(
        default="draft",
        pattern=CANDIDATE_PATTERN,
        description="`draft` (the draft, in the authoring sandbox) or `slug@V`.",
    )
    baseline: str = Field(
        default="live",
        pattern=BASELINE_PATTERN,
        description="`live` (the revision live when the eval starts) or `slug@V`.",
    )
    sessions: int | None = Field(
        default=None,
        ge=1,
        le=replay.MAX_EVAL_SESSIONS,
        description="Replay the newest this-many recorded sessions "
        f"(default {replay.DEFAULT_EVAL_SESSIONS}).",
    )
    session_ids: list[Annotated[str, Field(pattern=r"^session-[0-9a-f-]{36}$")]] | None = Field(
        default=None,
        min_length=1,
        max_length=replay.MAX_EVAL_SESSIONS,
        description="Replay exactly these recorded sessions.",
    )
    # 👉 JSON has no date-time type: the strict model would refuse every string here, so
    # this field alone parses one (RFC 3339 with a timezone; a bare number stays refused).
    since: IsoDateTime | None = Field(
        default=None,
        strict=False,
        description="Only sessions (and steps) created at or after this time (RFC 3339 "
        "with a timezone).",
    )
    steps: int = Field(
        default=replay.DEFAULT_EVAL_STEPS,
        ge=0,
        le=replay.MAX_EVAL_STEPS,
        description="Also replay the newest this-many ended workflow-agent steps of the "
        f"agent (default {replay.DEFAULT_EVAL_STEPS}: none).",
    )
    step_ids: list[Annotated[str, Field(pattern=r"^step-[0-9a-f-]{36}$")]] | None = Field(
        default=None,
        min_length=1,
        max_length=replay.MAX_EVAL_STEPS,
        description="Also replay exactly these recorded steps.",
    )
    judge: ModelName | None = Field(
        default=None,
        description="A model, named as an agent spec's `model` (`openai:gpt-4o`), asked to "
        "compare each changed item's answers: `final.judge` `{verdict, reason}`, a "
        "`worse` a regression. 422 `unknown_judge` when this deployment cannot build it.",
    )
    tools: Literal["recorded", "live"] = Field(
        default="recorded",
        description="`recorded`: a tool call is answered from the recording; `live`: run.",
    )
    on_miss: Literal["live", "fail"] = Field(
        default="fail",
        description="With `tools: recorded`, a call the recording does not hold: run it "
        "(`live`) or refuse it `eval_unrecorded` (`fail`).",
    )

    @model_validator(mode="after")
    def _one_selection(self) -> EvalCreate:
        if self.session_ids is not None and (self.sessions is not None or self.since is not None):
            raise ValueError("session_ids names the sessions: send no sessions or since with it")
        if self.step_ids is not None and self.steps:
            raise ValueError("step_ids names the steps: send no steps with it")
        return self


def _side(s: Session, caller: Caller, slug: str, ref: str) -> tuple[str, ResolvedAgent]:
    """One side of an eval of ``slug``: its pin and snapshot. ``draft`` / ``slug@draft``:
    the draft, by the one rule of who may run it (:func:`~api.routers.sessions.runnable`,
    the owner role); ``live``: the live revision now; ``slug@V``: that revision. 422
    UnknownCandidate for another agent's reference or a revision that does not exist."""
    if ref in ("draft", "live"):
        ref = f"{slug}@{ref}" if ref == "draft" else slug
    if ref.partition("@")[0] != slug:
        raise UnknownCandidate(f"an eval of '{slug}' replays a revision of '{slug}'")
    try:
        agent = runnable(s, caller, ref)
    except NotFound as exc:
        raise UnknownCandidate(exc.detail) from exc
    return f"{agent.slug}@{agent.version}", agent


@router.post(
    "/{slug}/evals",
    status_code=status.HTTP_202_ACCEPTED,
    responses=problem_responses(403, 404, 409, 422, 503),
    summary="Start an eval",
)
async def start_eval(
    slug: SlugPath,
    body: EvalCreate,
    engine: EngineDep,
    settings: SettingsDep,
    temporal: TemporalDep,
    caller: CallerDep,
    claim: IdempotencyDep,
) -> EvalSummary:
    """Replay recorded sessions of ``slug`` the caller may read on the candidate and on the
    baseline, and compare them (docs/change-safely.md, Replay against a candidate) → 202
    with the eval; poll ``GET …/evals/{id}`` for its progress and report. ``steps`` /
    ``step_ids`` replay the agent's recorded workflow-agent steps too (each input run as a
    step, its output schema checked, no handoff); a ``steps`` eval of an agent with no
    recorded session replays its steps alone (unless ``sessions`` was asked for).

    Needs ``viewer`` on the agent and the right to run both sides (a draft: ``owner``).
    422 ``unknown_candidate``, ``no_sessions``, ``unknown_sessions``, ``unknown_steps``,
    ``unknown_judge``, ``validation_error``; 404 ``agent_not_found``; 503
    ``engine_unavailable`` (nothing is left behind). With an ``Idempotency-Key`` the eval
    id is derived from it: a retry that takes over a request whose API process was killed
    attaches to the eval it started.
    """
    eval_id = f"eval-{claim.uuid() if claim else uuid.uuid4()}"

    def record() -> tuple[EvalRow, EvalInput, bool]:
        with session_scope(engine) as s:
            return _record_eval(
                s,
                eval_id=eval_id,
                slug=slug,
                body=body,
                caller=caller,
                settings=settings,
                keyed=bool(claim),
            )

    row, inp, existed = await asyncio.to_thread(record)
    try:
        await launch.launch_eval(
            await temporal.client(),
            task_queue=settings.task_queue,
            inp=inp,
            slug=row.agent_slug,
            owner=row.owner,
            summary=f"Eval of {row.agent_slug}: {row.candidate} against {row.baseline}",
            keyed=bool(claim),
        )
    except EngineUnavailable:
        if not existed:
            await asyncio.to_thread(_forget, engine, eval_id)
        raise
    return store.eval_summary(row)


def _record_eval(
    s: Session,
    *,
    eval_id: str,
    slug: str,
    body: EvalCreate,
    caller: Caller,
    settings: Settings,
    keyed: bool,
) -> tuple[EvalRow, EvalInput, bool]:
    """Check an eval request, record its row and build its workflow input: ``(the row as
    stored, the input, whether a keyed retry found the row already recorded)``. Raises what
    :func:`start_eval` answers (the caller's role, the agent, both sides, the judge, the
    recorded sessions and steps)."""
    caller.require(s, slug, "viewer")
    registry.get_agent(s, slug=slug)
    cand_pin, cand = _side(s, caller, slug, body.candidate)
    base_pin, base = _side(s, caller, slug, body.baseline)
    if body.judge is not None:
        judge.check_judge(body.judge)
    picked, steps = _recorded(s, caller, slug, body)
    options = {
        "tools": body.tools,
        "on_miss": body.on_miss,
        "sessions": body.sessions,
        "since": body.since.isoformat() if body.since else None,
        "session_ids": picked,
        "steps": body.steps,
        "judge": body.judge,
        "step_ids": steps,
        "candidate_pin": cand_pin,
        "baseline_pin": base_pin,
        "concurrency": settings.eval_concurrency,
    }
    # A keyed retry's eval may be a killed first attempt's, its workflow running.
    stored = s.get(EvalRow, eval_id) if keyed else None
    row = stored or EvalRow(
        id=eval_id,
        agent_slug=slug,
        candidate=body.candidate,
        candidate_digest=cand.digest,
        baseline=body.baseline,
        options=options,
        total=len(picked) + len(steps),
        owner=caller.user,
        workflow_id=eval_id,
    )
    if stored is None:
        s.add(row)
        s.flush()
    inp = EvalInput(
        eval_id=eval_id,
        recorded=picked,
        recorded_steps=steps,
        candidate=cand_pin,
        baseline=base_pin,
        judge=body.judge,
        candidate_agent=cand if cand.version == 0 else None,
        baseline_agent=base if base.version == 0 else None,
        user=caller.user,
        concurrency=settings.eval_concurrency,
        task_queue=settings.task_queue,
        config=settings.session_config(),
    )
    return EvalRow.model_validate(row.model_dump()), inp, stored is not None


def _recorded(
    s: Session, caller: Caller, slug: str, body: EvalCreate
) -> tuple[list[str], list[str]]:
    """The recorded sessions and steps of ``slug`` the eval replays, among those the caller
    may read: ``(session ids, step ids)``. An eval of steps finds no session to replay only
    when it asked for none (``sessions`` unset): it replays its steps alone. Raises
    :class:`~baton.evals.replay.NoSessions` and what the pickers raise."""
    visible = caller.visible(s)
    steps = replay.pick_steps(
        s, slug=slug, visible=visible, steps=body.steps, step_ids=body.step_ids, since=body.since
    )
    try:
        picked = replay.pick_sessions(
            s,
            slug=slug,
            visible=visible,
            sessions=body.sessions,
            session_ids=body.session_ids,
            since=body.since,
        )
    except replay.NoSessions:
        if not steps or body.sessions is not None:
            raise
        picked = []  # an eval of steps alone: the agent has no recorded session
    return picked, steps


def _forget(engine: Engine, eval_id: str) -> None:
    with session_scope(engine) as s:
        row = s.get(EvalRow, eval_id)
        if row is not None:
            s.delete(row)


@router.post(
    "/{slug}/evals/{eval_id}/cancel",
    dependencies=IDEMPOTENT,
    responses=problem_responses(404, 409, 422, 503),
    summary="Cancel an eval",
)
async def cancel_eval(
    slug: SlugPath,
    eval_id: EvalIdPath,
    engine: EngineDep,
    temporal: TemporalDep,
    caller: CallerDep,
) -> EvalSummary:
    """Cancel a running eval: it is ``cancelled`` at once, its replays in flight and their
    sessions are cancelled by its workflow. An eval that has ended is returned as it is.
    404 ``eval_not_found`` (as ``GET``)."""

    def mark() -> tuple[EvalRow, bool]:
        with session_scope(engine) as s:
            caller.require(s, slug, "viewer")
            row = store.get_eval(s, eval_id=eval_id, user=caller.acl_user, slug=slug)
            running = row.status == "running"
            if running:
                row.status = "cancelled"
                row.finished_at = utcnow()
                s.add(row)
                s.flush()
            return EvalRow.model_validate(row.model_dump()), running

    row, running = await asyncio.to_thread(mark)
    if running:
        await launch.cancel_run(await temporal.client(), workflow_id=row.workflow_id)
    return store.eval_summary(row)
