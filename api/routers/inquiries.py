"""``/v1/sessions/{id}/inquiries``: ask an ambassador about a session, read the thread.

AgentX Agent Teams, 'Ambassador'. The inquiry runs as its own ``Inquiry``
workflow (id ``inquiry-<uuid>``); nothing it does enters the session.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Path, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy.engine import Engine
from starlette.datastructures import UploadFile as StarletteUpload
from temporalio.client import WorkflowFailureError

from api.deps import Caller, CallerDep, EngineDep, SessionDep, SettingsDep, Temporal, TemporalDep
from api.idempotency import IDEMPOTENT
from api.problems import problem_responses
from baton.agents import registry
from baton.agents.schemas import Page
from baton.agents.spec import REF_PATTERN, SafeText, parse_ref
from baton.contracts.values import MAX_MESSAGE_CHARS
from baton.contracts.workflow_io import InquiryInput, InquiryResult
from baton.errors import BatonError, EngineUnavailable
from baton.providers import voice
from baton.runs import inquiries
from baton.settings import Settings
from baton.storage.db import session_scope

router = APIRouter(prefix="/v1/sessions", tags=["inquiries"])

SessionIdPath = Annotated[str, Path(pattern=r"^session-[0-9a-f-]{36}$")]


class InquiryTimedOut(BatonError):
    code = "inquiry_timeout"
    status = 504
    title = "Inquiry timed out"


class VoiceInputInvalid(BatonError):
    code = "invalid_voice_request"
    status = 422
    title = "Invalid voice request"


class InquiryCreate(BaseModel):
    """``POST /v1/sessions/{id}/inquiries``."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"question": "What did my agents decide?"}]},
    )

    question: SafeText = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    ambassador: str | None = Field(
        default=None,
        pattern=REF_PATTERN,
        description="An agent of kind ambassador; default BATON_DEFAULT_AMBASSADOR.",
    )

    @field_validator("question")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("question must not be blank")
        return value


@router.post(
    "/{session_id}/inquiries",
    status_code=status.HTTP_201_CREATED,
    responses=problem_responses(403, 404, 422, 503, 504),
    summary="Ask the ambassador",
    dependencies=IDEMPOTENT,
)
async def create_inquiry(
    session_id: SessionIdPath,
    body: InquiryCreate,
    engine: EngineDep,
    settings: SettingsDep,
    temporal: TemporalDep,
    caller: CallerDep,
) -> inquiries.InquiryPublic:
    """Ask an ambassador about the session and wait for its answer (``draft`` when it
    wrote one). Needs viewer on the session's agent and user on the ambassador (auth
    mode). 422 ``no_ambassador`` when none is named and no default is set, 422
    ``not_an_ambassador`` for an agent of another kind."""
    return await ask(
        engine,
        settings,
        temporal,
        caller,
        session_id=session_id,
        question=body.question,
        ambassador=body.ambassador,
    )


def _record(
    engine: Engine,
    settings: Settings,
    caller: Caller,
    inquiry_id: str,
    session_id: str,
    question: str,
    ambassador: str | None,
) -> str:
    """Check and record a new inquiry; its ambassador's pin. The caller must be able to
    read the session (404/403) and use the ambassador (``ambassador``, else
    BATON_DEFAULT_AMBASSADOR; 422 when neither is set), which must be of kind ambassador
    (422)."""
    with session_scope(engine) as s:
        inquiries.readable_session(s, session_id=session_id, user=caller.user, auth_on=caller.auth)
        ref = ambassador or settings.default_ambassador
        if not ref:
            raise inquiries.NoAmbassador(
                "name an ambassador (no BATON_DEFAULT_AMBASSADOR is set)", path="ambassador"
            )
        caller.require(s, parse_ref(ref)[0], "user")
        agent = registry.resolve_agent(s, ref=ref)
        if agent.kind != "ambassador":
            raise inquiries.NotAnAmbassador(
                f"'{agent.slug}' is of kind {agent.kind}, not ambassador", path="ambassador"
            )
        inquiries.create(
            s,
            inquiry_id=inquiry_id,
            session_id=session_id,
            user=caller.user,
            ambassador=agent.slug,
            version=agent.version,
            question=question,
        )
        return agent.pin


def _unanswered(engine: Engine, inquiry_id: str, error: str) -> None:
    """Record an inquiry that ended without an answer (Temporal unreachable, or the
    workflow's execution timeout), so no inquiry row stays running."""
    with session_scope(engine) as s:
        row = inquiries.get(s, inquiry_id=inquiry_id)
        inquiries.finish(s, inquiry_id=inquiry_id, answer=None, steps=row.steps, error=error)


async def ask(
    engine: Engine,
    settings: Settings,
    temporal: Temporal,
    caller: Caller,
    *,
    session_id: str,
    question: str,
    ambassador: str | None,
) -> inquiries.InquiryPublic:
    """The answer core of typed and spoken questions: record the inquiry, run its
    ``Inquiry`` workflow to the end, return the stored inquiry (see create_inquiry)."""
    inquiry_id = f"inquiry-{uuid.uuid4()}"

    pin = await asyncio.to_thread(
        _record, engine, settings, caller, inquiry_id, session_id, question, ambassador
    )
    cfg = settings.session_config()
    inp = InquiryInput(
        inquiry_id=inquiry_id,
        session_id=session_id,
        user=caller.user,
        auth=caller.auth,
        ambassador_pin=pin,
        question=question,
        default_model=cfg.default_model,
        prices=cfg.prices,
        max_steps=settings.inquiry_max_steps,
        model_turn_timeout_s=cfg.model_turn_timeout_s,
        config=cfg,
    )
    try:  # after every check: a bad request is its 4xx, Temporal down or not
        client = await temporal.client()
    except EngineUnavailable as exc:
        await asyncio.to_thread(_unanswered, engine, inquiry_id, exc.detail)
        raise
    try:
        await client.execute_workflow(
            "Inquiry",
            inp,
            id=inquiry_id,
            task_queue=settings.task_queue,
            result_type=InquiryResult,
            execution_timeout=timedelta(seconds=settings.inquiry_timeout),
            static_summary=f"inquiry · {pin} · {session_id}",
        )
    except WorkflowFailureError as exc:
        # The workflow stores every outcome itself; only its execution timeout (or an
        # operator's terminate) ends it without one: record that, so no row stays running.
        detail = f"the ambassador did not answer within {settings.inquiry_timeout:g} s"
        await asyncio.to_thread(_unanswered, engine, inquiry_id, detail)
        raise InquiryTimedOut(detail) from exc
    except Exception as exc:
        if isinstance(exc, BatonError):
            raise
        raise EngineUnavailable(f"cannot run the inquiry: {exc}") from exc

    def read() -> inquiries.InquiryPublic:
        with session_scope(engine) as s:
            return inquiries.to_public(inquiries.get(s, inquiry_id=inquiry_id))

    return await asyncio.to_thread(read)


@router.post(
    "/{session_id}/inquiries/voice",
    status_code=status.HTTP_201_CREATED,
    responses=problem_responses(403, 404, 413, 422, 502, 503, 504),
    summary="Ask the ambassador by voice",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "required": ["audio"],
                        "properties": {
                            "audio": {"type": "string", "format": "binary"},
                            "ambassador": {"type": "string", "pattern": REF_PATTERN},
                        },
                    },
                    "example": {"audio": "(question.webm)", "ambassador": "briefer"},
                }
            },
        }
    },
)
async def create_spoken_inquiry(
    session_id: SessionIdPath,
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    temporal: TemporalDep,
    caller: CallerDep,
) -> inquiries.InquiryPublic:
    """Transcribe the question (``/audio/transcriptions``) and answer it as a typed one:
    the inquiry's ``question`` is the transcript. 404 ``voice_off`` without a voice
    provider, 413 ``audio_too_large``, 502 ``voice_provider_error``."""
    if not voice.enabled(settings):
        raise voice.VoiceOff("voice is off: set BATON_VOICE_BASE_URL")
    # 404/403 before the provider hears anything.
    await asyncio.to_thread(_readable, engine, caller, session_id)
    async with request.form(max_files=1, max_fields=2) as form:
        audio, ambassador = form.get("audio"), form.get("ambassador")
        if not isinstance(audio, StarletteUpload):
            raise VoiceInputInvalid("send the question as the multipart file `audio`", path="audio")
        if ambassador is not None and (
            not isinstance(ambassador, str) or not re.fullmatch(REF_PATTERN, ambassador)
        ):
            raise VoiceInputInvalid("ambassador must be a slug or slug@version", path="ambassador")
        data = await audio.read(voice.MAX_AUDIO_BYTES + 1)
    text = await voice.transcribe(
        settings,
        filename=audio.filename or "question.webm",
        data=data,
        content_type=audio.content_type or "application/octet-stream",
    )
    if not text.strip():
        raise inquiries.NoQuestion("the recording holds no words", path="audio")
    return await ask(
        engine,
        settings,
        temporal,
        caller,
        session_id=session_id,
        question=text[:MAX_MESSAGE_CHARS],
        ambassador=ambassador,
    )


def _readable(engine: Engine, caller: Caller, session_id: str) -> None:
    with session_scope(engine) as s:
        inquiries.readable_session(s, session_id=session_id, user=caller.user, auth_on=caller.auth)


@router.get(
    "/{session_id}/inquiries/{inquiry_id}/speech",
    response_class=Response,
    responses={
        200: {"content": {"audio/mpeg": {}}, "description": "The answer, spoken"},
        **problem_responses(403, 404, 422, 502),
    },
    summary="Hear the ambassador's answer",
)
async def speak_answer(
    session_id: SessionIdPath,
    inquiry_id: Annotated[str, Path(pattern=r"^inquiry-[0-9a-f-]{36}$")],
    engine: EngineDep,
    settings: SettingsDep,
    caller: CallerDep,
) -> Response:
    """The answer as MP3 (``/audio/speech``): a spoken briefing. 404 ``voice_off``
    without a voice provider; 404 ``inquiry_not_found`` for another user's inquiry."""
    if not voice.enabled(settings):
        raise voice.VoiceOff("voice is off: set BATON_VOICE_BASE_URL")

    def answer() -> str:
        with session_scope(engine) as s:
            inquiries.readable_session(
                s, session_id=session_id, user=caller.user, auth_on=caller.auth
            )
            row = inquiries.get(s, inquiry_id=inquiry_id)
            if row.session_id != session_id or row.user_id != caller.user:
                raise inquiries.InquiryNotFound(f"no inquiry '{inquiry_id}' of yours here")
            return row.answer or row.error or ""

    text = await asyncio.to_thread(answer)
    return Response(content=await voice.speak(settings, text), media_type="audio/mpeg")


@router.get(
    "/{session_id}/inquiries",
    responses=problem_responses(403, 404, 422),
    summary="The inquiry thread",
)
def list_inquiries(
    session_id: SessionIdPath, session: SessionDep, caller: CallerDep
) -> Page[inquiries.InquiryPublic]:
    """The asking user's inquiries on this session, oldest first (one thread per session
    and user)."""
    inquiries.readable_session(
        session, session_id=session_id, user=caller.user, auth_on=caller.auth
    )
    rows = inquiries.thread(session, session_id=session_id, user=caller.user)
    return Page(data=[inquiries.to_public(r) for r in rows], count=len(rows))
