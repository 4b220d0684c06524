"""The web console at ``/ui``: approvals inbox (reviews and step handoffs), live
sessions, traces, the ambassador panel, agents and teams, steps, a session launcher.

Server-rendered with Jinja2; the live parts are a small script of the project's own
(``static/console.js``) over the API's SSE streams and JSON endpoints: no CDN, it
works offline. Authentication is the API's own dependency (:func:`api.deps.get_caller`):
in auth mode ``/ui/login`` stores the bearer token in an HttpOnly, SameSite=Strict
cookie that the dependency reads when no ``Authorization`` header is sent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, FastAPI, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader, select_autoescape
from sqlmodel import Session
from sse_starlette import EventSourceResponse, ServerSentEvent

from api.deps import TOKEN_COOKIE, Caller, app_temporal, get_caller, require_same_origin
from api.routers import evals as eval_routes
from api.routers.agents import get_agent, get_policies, list_revisions
from api.routers.sessions import get_transcript
from api.routers.steps import get_step, get_step_transcript
from api.routers.teams import get_team
from api.ui import agents as ui_agents
from api.ui import audit as ui_audit
from api.ui import evals as ui_evals
from api.ui import steps as ui_steps
from baton.agents import registry, teams
from baton.agents.schemas import MAX_OFFSET
from baton.errors import EngineUnavailable, InvalidCursor
from baton.grants import auth
from baton.grants.auth import Unauthorized
from baton.permissions import reviews
from baton.providers import voice
from baton.runs import inquiries, run_tree, session_store
from baton.settings import Settings
from baton.storage.db import ReviewRow, SessionRow, StepRow, session_scope

HERE = Path(__file__).parent
templates = Jinja2Templates(
    env=Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True),
    )
)
router = APIRouter(prefix="/ui", include_in_schema=False)
#: How often the inbox stream looks for changed reviews (seconds).
INBOX_POLL_S = 0.3
#: Resolved reviews the inbox keeps showing (their outcome), newest first.
RECENT_REVIEWS = 20
#: Steps the home page lists, newest first.
HOME_STEPS = 5
#: Evals an agent's page lists, newest first.
AGENT_EVALS = 20


#: Headers of every console page: its own files only (no CDN, no inline script), and never
#: inside a frame: a framed inbox's clicks are same-origin, so the cross-origin check
#: (api.deps.require_same_origin) could not stop a clickjacked approval. Images may also be
#: ``blob:`` URLs: an image exhibit is fetched from the API and shown as one (docs/exhibits.md).
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' blob:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}


def page(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200
) -> HTMLResponse:
    """A console page rendered from template ``name``, with :data:`PAGE_HEADERS`."""
    return templates.TemplateResponse(
        request, name, context, status_code=status_code, headers=PAGE_HEADERS
    )


class LoginRequired(Exception):
    """A console page was asked for without a valid token (auth mode): go to the login."""


def ui_caller(request: Request) -> Caller:
    """The API's caller dependency, turning 401 into a redirect to the login page."""
    try:
        return get_caller(request, request.headers.get("authorization"))
    except Unauthorized as exc:
        raise LoginRequired from exc


UiCaller = Annotated[Caller, Depends(ui_caller)]


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _page(request: Request, name: str, caller: Caller, **context: Any) -> HTMLResponse:
    return page(request, name, {"user": caller.user, "auth": caller.auth, **context})


def review_card(row: ReviewRow, timeout_s: float) -> dict[str, Any]:
    """A review as the console's cards show it: the API shape plus its deadline (ISO: the
    review's ``expires_at``, for older rows ``created_at`` + ``BATON_REVIEW_TIMEOUT``;
    Gamut X-Agent Policies, 'Review timeout')."""
    public = reviews.review_public(row).model_dump(mode="json")
    deadline = row.expires_at or row.created_at + timedelta(seconds=timeout_s)
    public["deadline"] = deadline.isoformat()
    return public


def inbox_state(session: Session, caller: Caller, timeout_s: float) -> dict[str, Any]:
    """Pending reviews the user may decide (user role on the caller agent, as
    ``POST /v1/reviews/{id}/decision`` requires) and the latest resolved ones, plus the
    step handoffs of :func:`api.ui.steps.handoff_state` (their deadlines unset)."""
    callers = caller.visible(session, "user")
    pending, _ = reviews.list_reviews(
        session, status="pending", callers=callers, limit=200, offset=0
    )
    recent, _ = reviews.list_reviews(session, callers=callers, limit=RECENT_REVIEWS, offset=0)
    cards = [review_card(r, timeout_s) for r in pending]
    ui_audit.add_review_context(session, cards)
    return {
        "pending": cards,
        "recent": [review_card(r, timeout_s) for r in recent if r.status != "pending"],
        **ui_steps.handoff_state(session, caller),
    }


async def _temporal(request: Request, cards: list[dict[str, Any]]) -> Any:
    """The app's Temporal client when ``cards`` need a handoff deadline from it; None
    when they do not, or while Temporal is unreachable (the pages still render, without
    handoff countdowns)."""
    if not ui_steps.needs_query(cards):
        return None
    try:
        return await app_temporal(request.app.state)
    except EngineUnavailable:
        return None


async def full_inbox_state(request: Request, caller: Caller) -> dict[str, Any]:
    """:func:`inbox_state` with each pending handoff's deadline."""
    settings = _settings(request)

    def read() -> dict[str, Any]:
        with session_scope(request.app.state.engine) as s:
            return inbox_state(s, caller, settings.review_timeout)

    state = await asyncio.to_thread(read)
    await ui_steps.add_deadlines(await _temporal(request, state["handoffs"]), state["handoffs"])
    return state


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request) -> HTMLResponse:
    """The token login (auth mode)."""
    return page(request, "login.html", {"error": None, "user": None})


@router.post("/login", response_model=None)
def login(request: Request, token: Annotated[str, Form(max_length=200)]) -> Response:
    """Check the token and keep it in the console's cookie; 403 ``cross_origin_request``
    for a login posted from another origin (login CSRF: it would plant another user's
    token in this browser)."""
    require_same_origin(request)
    engine = request.app.state.engine
    try:
        with session_scope(engine) as s:
            auth.user_for_token(s, token.strip())
    except Unauthorized:
        return page(
            request,
            "login.html",
            {"error": "That token is not valid.", "user": None},
            status_code=401,
        )
    out = RedirectResponse("/ui/inbox", status_code=303)
    # Secure over HTTPS (also behind a TLS proxy, via uvicorn's trusted X-Forwarded-Proto),
    # so the token never travels in clear; plain HTTP (baton dev) could not log in with it.
    secure = request.url.scheme == "https"
    out.set_cookie(
        TOKEN_COOKIE, token.strip(), httponly=True, samesite="strict", secure=secure, path="/"
    )
    return out


@router.post("/logout")
def logout(request: Request) -> RedirectResponse:
    """Forget the console's token; 403 ``cross_origin_request`` from another origin."""
    require_same_origin(request)
    out = RedirectResponse("/ui/login", status_code=303)
    out.delete_cookie(TOKEN_COOKIE, path="/")
    return out


@router.get("", response_class=HTMLResponse)
@router.get("/", response_class=HTMLResponse)
def home(request: Request, caller: UiCaller) -> HTMLResponse:
    """Sessions newest first, and the launcher."""
    engine = request.app.state.engine
    with session_scope(engine) as s:
        rows, total = session_store.list_sessions(s, limit=50, agents=caller.visible(s))
        listed = [session_store.to_public(r).model_dump(mode="json") for r in rows]
        agents, teams_ = _catalog(s, caller)
        steps = ui_steps.list_steps(s, caller, limit=HOME_STEPS)
    return _page(
        request,
        "home.html",
        caller,
        sessions=listed,
        total=total,
        agents=[a for a in agents if a["kind"] == "agent" and a["live_version"]],
        teams=teams_,
        steps=steps,
    )


def _catalog(s: Session, caller: Caller) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows, _ = registry.list_agents(s, limit=200, offset=0, only=caller.visible(s))
    agents = []
    for row in rows:
        public = registry.to_public(s, row)
        kind = "agent"
        if public.live_version is not None:
            kind = "ambassador" if registry.is_ambassador(s, slug=row.slug) else "agent"
        agents.append(
            {
                "slug": public.slug,
                "name": public.name,
                "description": public.description,
                "live_version": public.live_version,
                "retired": public.retired,
                "kind": kind,
            }
        )
    team_rows, _ = teams.list_teams(s, limit=200, offset=0, visible=caller.visible(s))
    return agents, [t.model_dump() for t in team_rows]


@router.get("/agents", response_class=HTMLResponse)
def agents_page(request: Request, caller: UiCaller) -> HTMLResponse:
    """Agents (with their live version and kind) and teams."""
    with session_scope(request.app.state.engine) as s:
        agents, teams_ = _catalog(s, caller)
    return _page(request, "agents.html", caller, agents=agents, teams=teams_)


@router.get("/inbox", response_class=HTMLResponse)
async def inbox(request: Request, caller: UiCaller) -> HTMLResponse:
    """The approvals inbox; the page keeps itself current over ``/ui/inbox/stream``."""
    state = await full_inbox_state(request, caller)
    return _page(request, "inbox.html", caller, state=state)


@router.get("/inbox/stream")
async def inbox_stream(request: Request, caller: UiCaller) -> EventSourceResponse:
    """SSE: an ``inbox`` event with the whole inbox state whenever it changes, so a
    decision made anywhere (console, API, CLI, Temporal CLI, timeout) shows in every
    open inbox."""

    async def gen() -> AsyncIterator[ServerSentEvent]:
        last = ""
        while not await request.is_disconnected():
            state = json.dumps(await full_inbox_state(request, caller), sort_keys=True)
            if state != last:
                last = state
                yield ServerSentEvent(event="inbox", data=state)
            await asyncio.sleep(INBOX_POLL_S)

    return EventSourceResponse(gen(), ping=15)


@router.get("/sessions/{session_id}", response_class=HTMLResponse)
def session_page(request: Request, session_id: str, caller: UiCaller) -> HTMLResponse:
    """A session: live transcript, delegation and review cards, the ambassador panel."""
    settings = _settings(request)
    with session_scope(request.app.state.engine) as s:
        row = inquiries.readable_session(
            s, session_id=session_id, user=caller.user, auth_on=caller.auth
        )
        public = session_store.to_public(row)
        thread = [
            inquiries.to_public(i).model_dump(mode="json")
            for i in inquiries.thread(s, session_id=session_id, user=caller.user)
        ]
        agents, _ = _catalog(s, caller)
    return _page(
        request,
        "session.html",
        caller,
        session=public,
        workflow_url=settings.workflow_url(session_id),
        thread=thread,
        ambassadors=[a["slug"] for a in agents if a["kind"] == "ambassador"],
        default_ambassador=settings.default_ambassador,
        review_timeout=settings.review_timeout,
        voice=voice.enabled(settings),
    )


@router.get("/sessions/{session_id}/trace", response_class=HTMLResponse)
def trace_page(request: Request, session_id: str, caller: UiCaller) -> HTMLResponse:
    """The run tree: each step's agent, status, tokens, cost and wall-clock (AgentX Agent Teams,
    'Team Run Trace')."""
    with session_scope(request.app.state.engine) as s:
        inquiries.readable_session(s, session_id=session_id, user=caller.user, auth_on=caller.auth)
        tree = run_tree.trace(s, session_id=session_id, links=_settings(request))
        refused = ui_audit.refused_calls(
            s, caller, list(dict.fromkeys(run_tree.run_sessions(s, root_session_id=session_id)))
        )
    return _page(
        request,
        "trace.html",
        caller,
        tree=tree.model_dump(mode="json"),
        session_id=session_id,
        refused=refused,
    )


@router.get("/steps", response_class=HTMLResponse)
async def steps_page(request: Request, caller: UiCaller) -> HTMLResponse:
    """Workflow-agent steps newest first: status, agent@version, attempt, deadline."""

    def read() -> list[dict[str, Any]]:
        with session_scope(request.app.state.engine) as s:
            return ui_steps.list_steps(s, caller)

    listed = await asyncio.to_thread(read)
    await ui_steps.add_deadlines(await _temporal(request, listed), listed)
    return _page(request, "steps.html", caller, steps=listed)


@router.get("/steps/{step_id}", response_class=HTMLResponse)
async def step_page(request: Request, step_id: str, caller: UiCaller) -> HTMLResponse:
    """A step: its input and schema, each attempt (the prompt fed back, its replies, the
    last rendered from the schema), the deliverable rendered from the schema, the error,
    and the handoff with time left.
    404 ``step_not_found``, 403 without the viewer role (the API's own checks)."""

    def read() -> tuple[dict[str, Any], StepRow, list[dict[str, Any]]]:
        with session_scope(request.app.state.engine) as s:
            get_step(step_id, s, caller)  # the API's 404 / 403
            row = s.get(StepRow, step_id)
            assert row is not None
            s.expunge(row)
            messages = get_step_transcript(step_id, s, caller).model_dump(mode="json")
            return ui_steps.step_card(row), row, messages["messages"]

    card, row, messages = await asyncio.to_thread(read)
    await ui_steps.add_deadlines(await _temporal(request, [card]), [card])
    return _page(
        request,
        "step.html",
        caller,
        step=card,
        input=row.input,
        schema=json.dumps(row.output_schema, indent=2) if row.output_schema else None,
        fields=ui_steps.deliverable_fields(row.output_schema, row.deliverable),
        deliverable_json=json.dumps(row.deliverable, indent=2, ensure_ascii=False),
        attempts=ui_steps.attempts_view(messages, row.output_schema),
    )


@router.get("/agents/{slug}", response_class=HTMLResponse)
def agent_page(
    request: Request,
    slug: str,
    caller: UiCaller,
    a: Annotated[str, Query(pattern=r"^$|^(draft|[1-9][0-9]{0,8})$")] = "",
    b: Annotated[str, Query(pattern=r"^$|^(draft|[1-9][0-9]{0,8})$")] = "",
    fmt: Annotated[str, Query(pattern=r"^(yaml|json)$")] = "yaml",
) -> HTMLResponse:
    """An agent (seed 004): identity, the live revision, every published revision
    (version, digest, published at, live marker) with Roll back to / Restore into draft,
    a diff between revisions ``a`` and ``b`` (a version or ``draft``; default: live
    against the draft), and the draft editor (``fmt`` yaml | json) with Publish and
    Retire. Reads through the API's functions (404 ``agent_not_found``, 403)."""
    with session_scope(request.app.state.engine) as s:
        public = get_agent(slug, s, caller)
        agent = public.model_dump(mode="json")
        # Specs as the editor and the diff show them: only what differs from the defaults.
        agent["draft"] = public.draft.model_dump(mode="json", exclude_defaults=True)
        revisions = []
        for rev in list_revisions(slug, s, caller).data:
            revisions.append(rev.model_dump(mode="json"))
            revisions[-1]["spec"] = rev.spec.model_dump(mode="json", exclude_defaults=True)
        can_edit = caller.has(s, slug, "owner")
        teams_, _ = teams.list_teams(s, limit=200, offset=0, visible=caller.visible(s))
        evals = eval_routes.list_evals(slug, s, caller, limit=AGENT_EVALS, offset=0)
    specs: dict[str, dict[str, Any]] = {str(r["version"]): r["spec"] for r in revisions}
    specs["draft"] = agent["draft"]
    live = str(agent["live_version"]) if agent["live_version"] else None
    old = a or live or (str(revisions[-1]["version"]) if revisions else "draft")
    new = b or "draft"
    diff = None
    if old in specs and new in specs:
        label = {k: (f"v{k}" if k != "draft" else "draft") for k in specs}
        diff = ui_agents.diff_lines(
            ui_agents.spec_text(specs[old]), ui_agents.spec_text(specs[new]), label[old], label[new]
        )
    return _page(
        request,
        "agent.html",
        caller,
        agent=agent,
        revisions=revisions,
        can_edit=can_edit,
        diff=diff,
        diff_a=old,
        diff_b=new,
        fmt=fmt,
        draft_text=ui_agents.spec_text(agent["draft"], fmt),
        teams=[t for t in teams_ if any(m.agent_id == slug for m in t.members)],
        evals=[e.model_dump(mode="json") for e in evals.data],
        evals_count=evals.count,
    )


@router.get("/agents/{slug}/evals/{eval_id}", response_class=HTMLResponse)
def eval_page(request: Request, slug: str, eval_id: str, caller: UiCaller) -> HTMLResponse:
    """An eval (docs/change-safely.md, The comparison): its totals, a table of its
    sessions, and per session the baseline's and the candidate's final answers side by
    side with the differing words marked, their tool sequences and cross-agent
    decisions, and the first messages of its two replays' transcripts. While it runs the
    page follows ``GET /v1/agents/{slug}/evals/{id}``. Reads through the API's functions
    (404 ``eval_not_found``, 403; each transcript as ``GET /v1/sessions/{id}/transcript``
    reads it)."""
    with session_scope(request.app.state.engine) as s:
        found = eval_routes.get_eval(slug, eval_id, s, caller)
        sessions = ui_evals.session_views(found.report or {})
        for view in sessions:
            if view.get("kind") == "step":
                continue
            view["transcripts"] = {
                side: ui_evals.transcript_view(
                    _replay_transcript(s, caller, found.id, view.get(f"{side}_session_id"))
                )
                for side in ("baseline", "candidate")
            }
    report = found.report or {}
    return _page(
        request,
        "eval.html",
        caller,
        ev=found.model_dump(mode="json", exclude={"report"}),
        totals=report.get("totals") or {},
        sessions=sessions,
        transcript_shown=ui_evals.TRANSCRIPT_SHOWN,
    )


def _replay_transcript(
    s: Session, caller: Caller, eval_id: str, session_id: Any
) -> session_store.Transcript | None:
    """The first :data:`~api.ui.evals.TRANSCRIPT_SHOWN` messages of ``session_id``, read by
    the transcript endpoint's own function (its visibility rule with it), when it is a
    replay of ``eval_id``; None for no id, no such session, or a session of another eval
    (a report names only its own replays: anything else is not shown)."""
    if not isinstance(session_id, str) or not session_id:
        return None
    row = s.get(SessionRow, session_id)
    if row is None or row.eval_id != eval_id:
        return None
    return get_transcript(session_id, s, caller, limit=ui_evals.TRANSCRIPT_SHOWN)


@router.post("/spec/parse")
def parse_spec(
    text: Annotated[str, Body(max_length=ui_agents.MAX_SPEC_CHARS)],
    fmt: Annotated[str, Body(alias="format", pattern=r"^(yaml|json)$")],
    _caller: UiCaller,
) -> dict[str, Any]:
    """``{text, format}`` → ``{spec}``: the draft editor's text as JSON, for the browser
    to send to ``PUT /v1/agents/{slug}/draft`` (which validates it). No side effect.
    422 ``invalid_spec_text`` (with ``line``) when it does not parse."""
    return {"spec": ui_agents.parse_spec_text(text, fmt)}


@router.get("/teams/{team_id}", response_class=HTMLResponse)
def team_page(request: Request, team_id: str, caller: UiCaller) -> HTMLResponse:
    """A team: its lead (the supervisor), members with their roles and hints, its routes
    and shared channel, and an editor of its members, lead and routes that saves through
    ``PUT /v1/teams/{id}`` (whose validation errors it shows); in auth mode only a user
    who owns every member gets the editor. 404 ``team_not_found`` for a missing or hidden
    team."""
    with session_scope(request.app.state.engine) as s:
        team = get_team(team_id, s, caller).model_dump()
        can_edit = all(caller.has(s, m["agent_id"], "owner") for m in team["members"])
        agents, _ = _catalog(s, caller)
    agents = [a for a in agents if a["kind"] != "ambassador"]
    return _page(request, "team.html", caller, team=team, can_edit=can_edit, agents=agents)


@router.get("/agents/{slug}/policies", response_class=HTMLResponse)
def policies_page(request: Request, slug: str, caller: UiCaller) -> HTMLResponse:
    """An agent's cross-agent permissions (Gamut X-Agent Policies, 'Managing policies in
    settings'): the three global toggles and one row per other agent the user can see
    (Read sessions, Send messages; "default" = no stored policy), with a search box.
    The page reads through ``GET /v1/agents/{slug}/policies`` (its 404 / 403 and its
    hiding of targets the user cannot see) and saves through ``PUT``; in auth mode only
    an owner of the agent may save (the page says so and leaves the controls off)."""
    with session_scope(request.app.state.engine) as s:
        agent = get_agent(slug, s, caller)
        current = get_policies(slug, s, caller).model_dump(mode="json", by_alias=True)
        agents, _ = _catalog(s, caller)
        can_edit = caller.has(s, slug, "owner")
    rows = [
        {
            "slug": a["slug"],
            "name": a["name"],
            "read": current["targets"].get(a["slug"], {}).get("read", "review"),
            "invoke": current["targets"].get(a["slug"], {}).get("invoke", "review"),
        }
        for a in agents
        if a["slug"] != slug and a["kind"] != "ambassador"
    ]
    return _page(
        request,
        "policies.html",
        caller,
        agent=agent.model_dump(mode="json"),
        policies=current,
        rows=rows,
        can_edit=can_edit,
    )


_SLUG_OR_ANY = r"^$|^[a-z0-9][a-z0-9-]{0,62}$"
_OUTCOME_OR_ANY = "^$|^(" + "|".join(ui_audit.OUTCOMES) + ")$"
_VIA_OR_ANY = "^$|^(" + "|".join(ui_audit.VIAS) + ")$"


@router.get("/audit", response_class=HTMLResponse)
def audit_page(
    request: Request,
    caller: UiCaller,
    agent: Annotated[str, Query(pattern=_SLUG_OR_ANY)] = "",
    target: Annotated[str, Query(pattern=_SLUG_OR_ANY)] = "",
    outcome: Annotated[str, Query(pattern=_OUTCOME_OR_ANY)] = "",
    via: Annotated[str, Query(pattern=_VIA_OR_ANY)] = "",
    session_id: Annotated[str, Query(pattern=r"^$|^session-[0-9a-f-]{36}$")] = "",
    review_id: Annotated[str, Query(pattern=r"^$|^review-[0-9a-f-]{36}$")] = "",
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    cursor: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
) -> HTMLResponse:
    """The audit log, newest first, filtered by agent (caller), target, outcome and via
    (and a session or review, as the review cards link), :data:`api.ui.audit.PAGE` rows a
    page, paged with the API's ``cursor`` (``offset`` still works); a bad filter is the
    API's 422 ``validation_error``, a cursor it never gave (or with ``offset``) 422
    ``invalid_cursor``."""
    if cursor is not None and offset:
        raise InvalidCursor("a cursor pages alone: drop offset", path="offset")
    filters = {
        "agent": agent,
        "target": target,
        "outcome": outcome,
        "via": via,
        "session_id": session_id,
        "review_id": review_id,
    }
    with session_scope(request.app.state.engine) as s:
        view = ui_audit.audit_view(s, caller, filters=filters, offset=offset, cursor=cursor)
        agents, _ = _catalog(s, caller)
    return _page(
        request,
        "audit.html",
        caller,
        view=view,
        filters=filters,
        agents=[a["slug"] for a in agents],
        outcomes=ui_audit.OUTCOMES,
        vias=ui_audit.VIAS,
    )


def install(app: FastAPI) -> None:
    """Serve the console: its routes, its static files, and the login redirect."""
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static")

    @app.exception_handler(LoginRequired)
    async def _to_login(_request: Request, _exc: LoginRequired) -> RedirectResponse:
        return RedirectResponse("/ui/login", status_code=303)
