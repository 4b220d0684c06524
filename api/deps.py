"""Shared FastAPI dependencies."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import Depends, Header, Request
from sqlalchemy.engine import Engine
from sqlmodel import Session
from temporalio.client import Client

from baton.errors import BatonError, EngineUnavailable
from baton.grants import auth as access
from baton.settings import Settings
from baton.storage.db import session_scope
from baton.workspaces.store import WorkspaceStore

log = logging.getLogger("baton.api")
#: Cookie of the web console holding the bearer token.
TOKEN_COOKIE = "baton_token"
#: Methods that change nothing: a cookie may carry them from anywhere (a link, a reload).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class CrossOriginRequest(BatonError):
    """A state-changing request with the console's cookie sent from another origin (403)."""

    code = "cross_origin_request"
    status = 403
    title = "Cross-origin request refused"


def _netloc(value: str, scheme: str) -> str:
    host = value.lower()
    default = {"http": ":80", "https": ":443"}.get(scheme, "")
    return host[: -len(default)] if default and host.endswith(default) else host


def require_same_origin(request: Request) -> None:
    """Refuse (CrossOriginRequest, 403 ``cross_origin_request``) a state-changing request
    a browser sent from a page of another origin; the one CSRF rule, for every request
    whose credentials a browser attaches on its own (the console cookie, the login form).

    SameSite=Strict is not enough: it keeps the cookie from other *sites*, but another
    port or subdomain of the same host is the same site (OWASP CSRF cheat sheet,
    'Fetch Metadata' and 'Verifying origin with standard headers'). ``Sec-Fetch-Site``
    must be ``same-origin`` (or ``none``) when sent; else an ``Origin`` header, when
    sent, must name this host (``null`` never does). A request with neither header does
    not come from a browser page, so it is not a forgery vector. Safe methods pass.
    """
    if request.method in SAFE_METHODS:
        return
    site = request.headers.get("sec-fetch-site")
    if site is not None and site.lower() not in ("same-origin", "none"):
        raise CrossOriginRequest(f"refused a {site} request carrying the console's cookie")
    origin = request.headers.get("origin")
    if origin is None:
        return
    parts = urlsplit(origin)
    host = request.headers.get("host", "")
    if not parts.netloc or _netloc(parts.netloc, parts.scheme) != _netloc(host, parts.scheme):
        raise CrossOriginRequest(f"refused a request from origin {origin[:100]!r}")


def get_session(request: Request) -> Iterator[Session]:
    """A DB session for one request; routes commit explicitly, anything else rolls back."""
    with Session(request.app.state.engine, expire_on_commit=False) as session:
        try:
            yield session
        finally:
            session.rollback()


def get_engine(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


def get_settings_dep(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


@dataclass(frozen=True)
class Caller:
    """Who is calling: the user (``local`` with auth off) and whether ACLs apply."""

    user: str
    auth: bool

    @property
    def acl_user(self) -> str | None:
        """The user whose roles and ownership a check applies: None with auth off (anyone
        may do anything), the caller in auth mode. The one rule every registry call,
        owned-resource lookup (webhooks, evals) and ACL check takes its user from."""
        return self.user if self.auth else None

    def require(self, session: Session, agent: str, role: access.Role) -> None:
        """Raise Forbidden (403) unless auth is off or the user holds ``role`` on ``agent``."""
        if self.auth:
            access.require(session, user_id=self.user, agent=agent, role=role)

    def has(self, session: Session, agent: str, role: access.Role) -> bool:
        """Whether auth is off or the user holds ``role`` on ``agent``."""
        return not self.auth or access.has_role(session, user_id=self.user, agent=agent, role=role)

    def team_members(self, session: Session, team_id: str) -> list[str]:
        """The members of a team the user may see: viewer on every member (a team's
        access is its members'). Raises TeamNotFound (404) for a missing team and for a
        hidden one alike, so the answer never tells a hidden team exists."""
        from baton.agents import teams

        slugs = teams.member_slugs(session, team_id=team_id)
        if not self.sees_team(session, slugs):
            raise teams.TeamNotFound(f"no team '{team_id}'")
        return slugs

    def sees_team(self, session: Session, members: list[str]) -> bool:
        """Whether a stored team with these ``members`` is visible to the user (viewer on
        every member); False for no members (no such team)."""
        return bool(members) and all(self.has(session, s, "viewer") for s in members)

    def require_on(self, engine: Engine, agent: str, role: access.Role) -> None:
        """:meth:`require` in a session of its own (for async routes, via ``to_thread``);
        no database work at all with auth off."""
        if self.auth:
            with session_scope(engine) as s:
                self.require(s, agent, role)

    def visible(self, session: Session, role: access.Role = "viewer") -> list[str] | None:
        """Slugs the user may see with ``role``; None = everything (auth off)."""
        return access.accessible(session, user_id=self.user, role=role) if self.auth else None


def get_caller(
    request: Request,
    authorization: Annotated[
        str | None, Header(description="`Bearer <token>` (auth mode only).")
    ] = None,
) -> Caller:
    """The calling user: ``local`` with ``BATON_AUTH=off``; else from the bearer token (401).

    Without an ``Authorization`` header the web console's ``baton_token`` cookie
    (SameSite=Strict, HttpOnly; set by ``/ui/login``) carries the same bearer token.
    """
    settings: Settings = request.app.state.settings
    if settings.auth == "off":
        return Caller(user=access.LOCAL_USER, auth=False)
    if authorization is None and request.cookies.get(TOKEN_COOKIE):
        require_same_origin(request)  # a browser sends the cookie on its own (CSRF)
        authorization = f"Bearer {request.cookies[TOKEN_COOKIE]}"
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise access.Unauthorized("send `Authorization: Bearer <token>` (BATON_AUTH=on)")
    with session_scope(request.app.state.engine) as s:
        return Caller(user=access.user_for_token(s, token.strip()), auth=True)


CallerDep = Annotated[Caller, Depends(get_caller)]


async def app_temporal(state: Any) -> Client:
    """``state.temporal`` (the app's one client), connecting on first use.

    Raises :class:`~baton.errors.EngineUnavailable` (503) when Temporal cannot be
    reached; :func:`get_temporal` and ``/readyz`` both come through here.
    """
    if state.temporal is None:
        async with state.temporal_lock:
            if state.temporal is None:
                from worker.factory import connect

                try:
                    # connect() bounds itself (BATON_TEMPORAL_CONNECT_TIMEOUT) and names
                    # the target without secrets.
                    state.temporal = await connect(state.settings)
                except EngineUnavailable as exc:
                    log.warning("Temporal unavailable: %s", exc.detail)
                    raise
    client: Client = state.temporal
    return client


async def get_temporal(request: Request, _caller: CallerDep) -> Client:
    """The app's Temporal client, connecting on first use; 503 ``engine_unavailable`` if down.

    Takes the caller so that an unauthenticated request is refused (401) before it can
    make the API open a connection to Temporal. Routes call it (or :class:`Temporal`)
    once they have validated the request, never as a dependency: FastAPI runs
    dependencies before it validates the body, so a malformed request would be a 503
    while Temporal is down instead of its 422.
    """
    return await app_temporal(request.app.state)


@dataclass(frozen=True)
class Temporal:
    """The app's Temporal client, not connected yet: ``await temporal.client()`` once the
    route has validated its request (body, references, ACL), so that a bad request gets
    its 4xx whether Temporal is up or not and only a valid one can be a 503
    ``engine_unavailable`` (:func:`app_temporal`)."""

    state: Any

    async def client(self) -> Client:
        """The connected client (connects on first use); raises EngineUnavailable (503)."""
        return await app_temporal(self.state)


def get_temporal_later(request: Request, _caller: CallerDep) -> Temporal:
    """:class:`Temporal` for a route: resolving it connects nothing (the caller is still
    checked first, 401)."""
    return Temporal(request.app.state)


SessionDep = Annotated[Session, Depends(get_session)]


def get_workspaces(request: Request) -> WorkspaceStore:
    """The session workspaces' store the lifespan opened (``BATON_WORKSPACE_*``)."""
    store: WorkspaceStore = request.app.state.workspaces
    return store


EngineDep = Annotated[Engine, Depends(get_engine)]
WorkspacesDep = Annotated[WorkspaceStore, Depends(get_workspaces)]
SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
#: The lazy Temporal client of a route (:class:`Temporal`): connect after validating.
TemporalDep = Annotated[Temporal, Depends(get_temporal_later)]
