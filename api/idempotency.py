"""``Idempotency-Key`` on every POST that creates or changes something (docs/api.md,
Idempotency; draft-ietf-httpapi-idempotency-key-header).

The one rule, for every route that declares :data:`IdempotencyDep` (or lists
:func:`idempotency` in its ``dependencies``):

- no header: nothing changes;
- a key seen before, from the same caller, with the same request (method, path and body,
  JSON compared after canonicalisation): the first answer again, status and body, with
  ``Idempotent-Replayed: true``;
- the same key with another request: 422 ``idempotency_key_reused``;
- the same key while its first request still runs: 409 ``idempotency_key_in_flight``
  (retry later);
- a key that is not 1..255 visible ASCII characters: 422 ``invalid_idempotency_key``.

Keys live in the database (``idempotency_keys``), so any API replica answers a retry; the
scope is the caller (``local`` with auth off, the user, or an external session's proxy
token), so one caller's key never answers another's. Answers that say "not now" rather
than "this is the outcome" are not kept, so a retry runs again: 401, 403, 409, 429 and
every 5xx; nor is an answer carrying a secret shown once (an external session's proxy
token, which Baton stores only hashed). A key is kept ``BATON_IDEMPOTENCY_TTL`` seconds,
then purged.

An in-flight request holds its key for ``BATON_IDEMPOTENCY_LEASE`` seconds, renewed while
it runs. When its API process is killed the renewals stop, and once the lease lapses a
retry (on any replica) takes the request over and runs it again: the routes derive the
ids they create from the key (:meth:`Claim.uuid`: the session id, the message's Update
id, the step id, the decision id), so the second run attaches to what the first started
and nothing is created twice.

:class:`IdempotencyRecorder` (ASGI middleware) captures the answer of a claimed request
and stores it before sending it; a failure to store is logged and the answer still sent
(the lapsed lease then lets a retry take over, converging on the same ids).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Annotated, Any

import sqlalchemy as sa
from fastapi import Depends, FastAPI, Header, Request, Response
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.deps import get_caller
from baton.errors import BatonError, Conflict
from baton.runs import external
from baton.settings import Settings
from baton.storage.db import IdempotencyKeyRow, session_scope, utcnow

log = logging.getLogger("baton.api")

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_CHARS = 255
#: Answers that are not the request's outcome but "not now": never replayed.
NOT_KEPT = frozenset({401, 403, 409, 429})
#: Namespace of the ids derived from a key (:meth:`Claim.uuid`).
_ID_NAMESPACE = uuid.UUID("6f1d2c1e-3b0a-4f43-9a57-7c1b1b0e9d21")
_STATE = "idempotency"
_T = IdempotencyKeyRow.__table__  # type: ignore[attr-defined]


class InvalidIdempotencyKey(BatonError):
    """An ``Idempotency-Key`` that is not 1..255 visible ASCII characters (422)."""

    code = "invalid_idempotency_key"
    status = 422
    title = "Invalid Idempotency-Key"


class IdempotencyKeyReused(BatonError):
    """The key was used before for another request (method, path or body) (422)."""

    code = "idempotency_key_reused"
    status = 422
    title = "Idempotency-Key reused"


class IdempotencyKeyInFlight(Conflict):
    """The first request with this key is still running (409): retry later."""

    code = "idempotency_key_in_flight"


@dataclass(frozen=True)
class Stored:
    """The kept answer of a key's first request."""

    status: int
    media_type: str | None
    body: str


class Replay(Exception):
    """Raised by :func:`idempotency` to answer with a kept answer (see :func:`install`)."""

    def __init__(self, stored: Stored) -> None:
        super().__init__(stored.status)
        self.stored = stored


# --- the table ---------------------------------------------------------------------


def _where(scope: str, key: str) -> Any:
    return sa.and_(_T.c.scope == scope, _T.c.key == key)


def claim_key(
    engine: Engine,
    *,
    scope: str,
    key: str,
    fingerprint: str,
    now: datetime,
    ttl: timedelta,
    lease: timedelta,
) -> Stored | None:
    """Claim ``key`` of ``scope`` for a request with ``fingerprint`` at ``now``.

    Returns None when the caller now holds the key (a new key, one past its ``ttl``, or
    an in-flight one whose ``lease`` lapsed: its process stopped renewing it), the kept
    answer when the key's request was answered. Raises IdempotencyKeyReused (another
    fingerprint) and IdempotencyKeyInFlight (held by a live request). Purges every key
    past its ``ttl`` on the way.
    """
    for _ in range(2):  # a second pass when a concurrent first claim won the insert
        with session_scope(engine) as s:
            s.execute(sa.delete(_T).where(_T.c.expires_at <= now))
            row = s.execute(sa.select(_T).where(_where(scope, key))).one_or_none()
            if row is None:
                try:
                    s.execute(
                        sa.insert(_T).values(
                            scope=scope,
                            key=key,
                            fingerprint=fingerprint,
                            locked_until=now + lease,
                            created_at=now,
                            expires_at=now + ttl,
                        )
                    )
                    s.commit()
                except IntegrityError:
                    s.rollback()
                    continue
                return None
            if row.fingerprint != fingerprint:
                msg = f"Idempotency-Key {key!r} was used for another request"
                raise IdempotencyKeyReused(msg, path=HEADER)
            if row.response_status is not None:
                return Stored(row.response_status, row.response_type, row.response_body or "")
            taken = s.execute(
                sa.update(_T)
                .where(_where(scope, key))
                .where(_T.c.response_status.is_(None), _T.c.locked_until <= now)
                .values(locked_until=now + lease)
            )
            if taken.rowcount != 1:  # type: ignore[attr-defined]
                raise IdempotencyKeyInFlight(
                    f"a request with Idempotency-Key {key!r} is still running; retry later"
                )
            return None  # its process stopped renewing it: this request takes it over
    raise IdempotencyKeyInFlight(f"a request with Idempotency-Key {key!r} is starting")


def renew_key(engine: Engine, *, scope: str, key: str, until: datetime) -> None:
    """Hold an in-flight key until ``until``."""
    with session_scope(engine) as s:
        s.execute(
            sa.update(_T)
            .where(_where(scope, key), _T.c.response_status.is_(None))
            .values(locked_until=until)
        )


def store_answer(
    engine: Engine, *, scope: str, key: str, status: int, media_type: str | None, body: bytes
) -> None:
    """Keep the answer of a claimed key's request."""
    with session_scope(engine) as s:
        s.execute(
            sa.update(_T)
            .where(_where(scope, key))
            .values(
                response_status=status,
                response_type=media_type,
                response_body=body.decode("utf-8", errors="replace"),
            )
        )


def release_key(engine: Engine, *, scope: str, key: str) -> None:
    """Forget an unanswered key (its answer is not kept): a retry runs afresh."""
    with session_scope(engine) as s:
        s.execute(sa.delete(_T).where(_where(scope, key), _T.c.response_status.is_(None)))


# --- the request -------------------------------------------------------------------


def fingerprint(method: str, path: str, body: bytes) -> str:
    """SHA-256 (hex) of the request: method, path and body; a JSON body canonicalised
    (keys sorted, no whitespace), so the same JSON written otherwise is the same request."""
    try:
        canonical = json.dumps(
            json.loads(body), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode()
    except ValueError:
        canonical = body
    digest = hashlib.sha256(f"{method} {path}\n".encode())
    digest.update(canonical)
    return digest.hexdigest()


def caller_scope(request: Request) -> str:
    """Whose key it is: ``local`` (auth off), ``proxy:<session>`` for an external
    session's proxy token, else ``user:<id>`` of the bearer token. Raises Unauthorized
    (401) as :func:`api.deps.get_caller` and :func:`baton.runs.external.authenticate` do."""
    settings: Settings = request.app.state.settings
    if settings.auth == "off":
        return "local"
    authorization = request.headers.get("authorization")
    token = external.bearer(authorization)
    if token is not None and token.startswith(external.PROXY_PREFIX):
        with session_scope(request.app.state.engine) as s:
            return f"proxy:{external.authenticate(s, token).session_id}"
    return f"user:{get_caller(request, authorization).user}"


def _check(key: str) -> str:
    if not 1 <= len(key) <= MAX_KEY_CHARS or not all("!" <= c <= "~" for c in key):
        msg = f"an {HEADER} is 1..{MAX_KEY_CHARS} visible ASCII characters (no spaces)"
        raise InvalidIdempotencyKey(msg, path=HEADER)
    return key


@dataclass
class Claim:
    """A key this request holds: renewed until :meth:`finish` or :meth:`abandon`."""

    engine: Engine
    scope: str
    key: str
    lease: timedelta
    done: bool = False
    #: False: the answer must not be stored (it carries a secret shown once).
    keep: bool = True
    _renewer: asyncio.Task[None] | None = field(default=None, repr=False)

    def uuid(self, kind: str = "") -> uuid.UUID:
        """A UUID derived from the caller, the key and ``kind``: the same on every run of
        this key's request, so a run that takes over a killed one creates nothing new."""
        return uuid.uuid5(_ID_NAMESPACE, f"{self.scope}\0{self.key}\0{kind}")

    def start(self) -> None:
        self._renewer = asyncio.get_running_loop().create_task(self._renew())

    async def _renew(self) -> None:
        every = self.lease.total_seconds() / 3
        while True:
            await asyncio.sleep(every)
            try:
                await asyncio.to_thread(
                    renew_key,
                    self.engine,
                    scope=self.scope,
                    key=self.key,
                    until=utcnow() + self.lease,
                )
            except Exception as exc:  # a dropped database: the next renewal may land
                log.warning("could not renew %s %r: %s", HEADER, self.key, type(exc).__name__)

    async def _stop(self) -> None:
        self.done = True
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer

    async def finish(self, status: int, media_type: str | None, body: bytes) -> None:
        """Keep the answer (when it is an outcome, not :data:`NOT_KEPT` or a 5xx), else
        forget the key. A database error is logged, never raised: the answer still goes."""
        await self._stop()
        kept = self.keep and status < 500 and status not in NOT_KEPT
        try:
            if kept:
                await asyncio.to_thread(
                    store_answer,
                    self.engine,
                    scope=self.scope,
                    key=self.key,
                    status=status,
                    media_type=media_type,
                    body=body,
                )
            else:
                await asyncio.to_thread(release_key, self.engine, scope=self.scope, key=self.key)
        except Exception as exc:
            log.warning("could not keep the answer of %s %r: %s", HEADER, self.key, exc)

    async def abandon(self) -> None:
        """The request failed without an answer (an unexpected error): forget the key."""
        await self._stop()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(release_key, self.engine, scope=self.scope, key=self.key)


async def idempotency(
    request: Request,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias=HEADER,
            description="Makes a retry safe: the same key with the same request answers "
            "the first answer again (`Idempotent-Replayed: true`); with another request "
            "422 `idempotency_key_reused`; while the first still runs 409 "
            "`idempotency_key_in_flight`. 1..255 visible ASCII characters, e.g. a UUID; "
            "kept `BATON_IDEMPOTENCY_TTL` seconds, per caller (docs/api.md, Idempotency).",
            examples=["4f0c2b9e-8a43-4c1e-9d7a-0e6c3f1d2a55"],
        ),
    ] = None,
) -> Claim | None:
    """The dependency: None without the header; a :class:`Claim` this request now holds;
    raises :class:`Replay` (the kept answer), IdempotencyKeyReused, IdempotencyKeyInFlight,
    InvalidIdempotencyKey, or Unauthorized (401) for an unknown token."""
    if idempotency_key is None:
        return None
    key = _check(idempotency_key)
    settings: Settings = request.app.state.settings
    engine: Engine = request.app.state.engine
    scope = await asyncio.to_thread(caller_scope, request)
    body = await request.body()
    lease = timedelta(seconds=settings.idempotency_lease)
    stored = await asyncio.to_thread(
        claim_key,
        engine,
        scope=scope,
        key=key,
        fingerprint=fingerprint(request.method, request.url.path, body),
        now=utcnow(),
        ttl=timedelta(seconds=settings.idempotency_ttl),
        lease=lease,
    )
    if stored is not None:
        raise Replay(stored)
    claim = Claim(engine=engine, scope=scope, key=key, lease=lease)
    holder = request.scope.get("state", {}).get(_STATE)
    if isinstance(holder, _Holder):
        holder.claim = claim
    claim.start()
    return claim


IdempotencyDep = Annotated[Claim | None, Depends(idempotency)]
#: For a route's ``dependencies=`` when it needs no derived id.
IDEMPOTENT = [Depends(idempotency)]


@dataclass
class _Holder:
    claim: Claim | None = None


class IdempotencyRecorder:
    """ASGI middleware: hands each HTTP request a holder for its :class:`Claim` and, when
    the request claimed a key, keeps the answer before sending it (or forgets the key
    when the request failed without one)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        holder = _Holder()
        scope.setdefault("state", {})[_STATE] = holder
        start: Message | None = None
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal start
            claim = holder.claim
            if claim is None or claim.done:
                await send(message)
                return
            if message["type"] == "http.response.start":
                start = message
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            assert start is not None
            body = b"".join(chunks)
            headers = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
            await claim.finish(int(start["status"]), headers.get("content-type"), body)
            await send(start)
            await send({"type": "http.response.body", "body": body})

        try:
            await self.app(scope, receive, capture)
        finally:
            if holder.claim is not None and not holder.claim.done:
                await holder.claim.abandon()


def install(app: FastAPI) -> None:
    """Add the recorder and the :class:`Replay` answer to ``app``."""

    @app.exception_handler(Replay)
    async def _replay(_request: Request, exc: Replay) -> Response:
        stored = exc.stored
        return Response(
            stored.body,
            status_code=stored.status,
            media_type=stored.media_type,
            headers={REPLAYED_HEADER: "true"},
        )

    app.add_middleware(IdempotencyRecorder)


def document(schema: dict[str, Any]) -> None:
    """Add to an OpenAPI document the 409 and 422 answers of every operation that takes
    the ``Idempotency-Key`` header (a route may already document its own 409 or 422)."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            params = operation.get("parameters", [])
            if not any(p.get("in") == "header" and p.get("name") == HEADER for p in params):
                continue
            responses = operation.setdefault("responses", {})
            for status, text in (
                ("409", "`idempotency_key_in_flight`: the first request with this key runs"),
                ("422", "`invalid_idempotency_key`, `idempotency_key_reused`"),
            ):
                entry = responses.setdefault(
                    status,
                    {
                        "description": "Problem",
                        "content": {
                            "application/problem+json": {
                                "schema": {"$ref": "#/components/schemas/Problem"}
                            }
                        },
                    },
                )
                entry["description"] = f"{entry.get('description', 'Problem')}; or: {text}"
