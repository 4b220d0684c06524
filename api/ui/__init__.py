"""The web console at ``/ui`` (issue 15): approvals inbox, live sessions, traces, the
ambassador panel, agents and teams, a session launcher.

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

from fastapi import APIRouter, Depends, FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader, select_autoescape
from sqlmodel import Session
from sse_starlette import EventSourceResponse, ServerSentEvent

from api.deps import TOKEN_COOKIE, Caller, get_caller, require_same_origin
from baton.agents import registry, teams
from baton.grants import auth
from baton.grants.auth import Unauthorized
from baton.permissions import reviews
from baton.providers import voice
from baton.runs import inquiries, run_tree, session_store
from baton.settings import Settings
from baton.storage.db import ReviewRow, session_scope

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


#: Headers of every console page: its own files only (no CDN, no inline script), and never
#: inside a frame: a framed inbox's clicks are same-origin, so the cross-origin check
#: (api.deps.require_same_origin) could not stop a clickjacked approval.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'self'; object-src 'none'",
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
    """A review as the console's cards show it: the API shape plus its deadline (ISO,
    ``created_at`` + ``BATON_REVIEW_TIMEOUT``; Gamut X-Agent Policies, 'Review timeout')."""
    public = reviews.review_public(row).model_dump(mode="json")
    public["deadline"] = (row.created_at + timedelta(seconds=timeout_s)).isoformat()
    return public


def inbox_state(session: Session, caller: Caller, timeout_s: float) -> dict[str, Any]:
    """Pending reviews the user may decide (user role on the caller agent, as
    ``POST /v1/reviews/{id}/decision`` requires) and the latest resolved ones."""
    callers = caller.visible(session, "user")
    pending, _ = reviews.list_reviews(
        session, status="pending", callers=callers, limit=200, offset=0
    )
    recent, _ = reviews.list_reviews(session, callers=callers, limit=RECENT_REVIEWS, offset=0)
    return {
        "pending": [review_card(r, timeout_s) for r in pending],
        "recent": [review_card(r, timeout_s) for r in recent if r.status != "pending"],
    }


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
        listed = [session_store.to_public(r) for r in rows]
        agents, teams_ = _catalog(s, caller)
    return _page(
        request,
        "home.html",
        caller,
        sessions=listed,
        total=total,
        agents=[a for a in agents if a["kind"] == "agent" and a["live_version"]],
        teams=teams_,
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
def inbox(request: Request, caller: UiCaller) -> HTMLResponse:
    """The approvals inbox; the page keeps itself current over ``/ui/inbox/stream``."""
    settings = _settings(request)
    with session_scope(request.app.state.engine) as s:
        state = inbox_state(s, caller, settings.review_timeout)
    return _page(request, "inbox.html", caller, state=state)


@router.get("/inbox/stream")
async def inbox_stream(request: Request, caller: UiCaller) -> EventSourceResponse:
    """SSE: an ``inbox`` event with the whole inbox state whenever it changes, so a
    decision made anywhere (console, API, CLI, Temporal CLI, timeout) shows in every
    open inbox."""
    settings = _settings(request)
    engine = request.app.state.engine

    def read() -> str:
        with session_scope(engine) as s:
            return json.dumps(inbox_state(s, caller, settings.review_timeout), sort_keys=True)

    async def gen() -> AsyncIterator[ServerSentEvent]:
        last = ""
        while not await request.is_disconnected():
            state = await asyncio.to_thread(read)
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
    return _page(
        request, "trace.html", caller, tree=tree.model_dump(mode="json"), session_id=session_id
    )


def install(app: FastAPI) -> None:
    """Serve the console: its routes, its static files, and the login redirect."""
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static")

    @app.exception_handler(LoginRequired)
    async def _to_login(_request: Request, _exc: LoginRequired) -> RedirectResponse:
        return RedirectResponse("/ui/login", status_code=303)
