"""The API and console over HTTP against a hostile page or client: the console cookie
across origins (CSRF), a Secure cookie behind TLS, no framing, no cross-origin logout, and
chunked bodies counted against the body limit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.app import create_app
from api.deps import TOKEN_COOKIE
from baton.grants import auth
from baton.settings import Settings
from baton.storage.db import make_engine, session_scope
from tests.conftest import migrated, serve

# --- the console cookie across origins (CSRF) ------------------------------------------


@pytest.fixture
def cookie_api(tmp_path: Path) -> Iterator[tuple[httpx.Client, dict[str, str]]]:
    """The real API in auth mode (no Temporal needed) with users alice and bob; their
    plaintext tokens by user."""
    url = migrated(f"sqlite:///{tmp_path / 'csrf.db'}")
    server, thread, base = serve(create_app(Settings(database_url=url, auth="on")))
    engine = make_engine(url)
    tokens: dict[str, str] = {}
    with session_scope(engine) as s:
        for user in ("alice", "bob"):
            auth.create_user(s, user_id=user)
            tokens[user] = auth.issue_token(s, user_id=user)[1]
    engine.dispose()
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            yield client, tokens
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _alice_agent(client: httpx.Client, token: str, slug: str) -> None:
    who = {"Authorization": f"Bearer {token}"}
    spec = {"playbook": [{"reply": "ok"}]}
    made = client.post("/v1/agents", json={"slug": slug, "name": slug, "spec": spec}, headers=who)
    assert made.status_code == 201, made.text
    assert client.post(f"/v1/agents/{slug}/publish", headers=who).status_code == 201


def _as_browser(client: httpx.Client, token: str, **headers: str) -> dict[str, str]:
    """Headers a browser sends with the console's cookie (no Authorization header)."""
    return {"Cookie": f"{TOKEN_COOKIE}={token}", **headers}


def test_a_cookie_post_from_another_origin_of_the_same_site_is_refused(
    cookie_api: tuple[httpx.Client, dict[str, str]],
) -> None:
    """A form POST from another port of the same host (same site, so SameSite=Strict still
    sends the cookie) cannot retire alice's agent: 403 cross_origin_request, agent live."""
    client, tokens = cookie_api
    _alice_agent(client, tokens["alice"], "victim")
    evil = f"http://localhost:{(client.base_url.port or 80) + 1}"
    for headers in (
        {"Origin": evil, "Sec-Fetch-Site": "same-site"},  # a modern browser
        {"Origin": evil},  # a browser without Fetch Metadata
        {"Origin": "null"},  # a sandboxed iframe or a data: page
    ):
        resp = client.post(
            "/v1/agents/victim/retire", headers=_as_browser(client, tokens["alice"], **headers)
        )
        assert resp.status_code == 403, (headers, resp.text)
        assert resp.headers["content-type"].startswith("application/problem+json")
        assert resp.json()["code"] == "cross_origin_request"
    who = {"Authorization": f"Bearer {tokens['alice']}"}
    assert client.get("/v1/agents/victim", headers=who).json()["retired"] is False


def test_a_cookie_post_from_the_console_itself_still_works(
    cookie_api: tuple[httpx.Client, dict[str, str]],
) -> None:
    """The console's own fetches (same origin; with or without Fetch Metadata) and bearer
    clients (any Origin: a token is not sent by a browser on its own) keep working."""
    client, tokens = cookie_api
    _alice_agent(client, tokens["alice"], "kept")
    own = f"http://{client.base_url.host}:{client.base_url.port}"
    resp = client.post(
        "/v1/agents/kept/retire",
        headers=_as_browser(
            client, tokens["alice"], Origin=own, **{"Sec-Fetch-Site": "same-origin"}
        ),
    )
    assert resp.status_code == 200, resp.text
    _alice_agent(client, tokens["alice"], "kept2")
    resp = client.post(
        "/v1/agents/kept2/retire", headers=_as_browser(client, tokens["alice"], Origin=own)
    )
    assert resp.status_code == 200, resp.text
    _alice_agent(client, tokens["alice"], "kept3")
    resp = client.post(
        "/v1/agents/kept3/retire",
        headers={"Authorization": f"Bearer {tokens['alice']}", "Origin": "http://elsewhere"},
    )
    assert resp.status_code == 200, resp.text
    # Reading with the cookie needs no Origin (a GET changes nothing).
    got = client.get("/v1/agents/kept", headers=_as_browser(client, tokens["alice"]))
    assert got.status_code == 200


def test_a_cross_origin_login_cannot_plant_bobs_token_in_alices_browser(
    cookie_api: tuple[httpx.Client, dict[str, str]],
) -> None:
    """Login CSRF: a page elsewhere posting bob's token to /ui/login is refused (403, no
    cookie set), so alice's console never acts as bob; the console's own login works."""
    client, tokens = cookie_api
    evil = f"http://localhost:{(client.base_url.port or 80) + 1}"
    resp = client.post(
        "/ui/login",
        data={"token": tokens["bob"]},
        headers={"Origin": evil, "Sec-Fetch-Site": "same-site"},
    )
    assert resp.status_code == 403
    assert TOKEN_COOKIE not in resp.cookies
    own = f"http://{client.base_url.host}:{client.base_url.port}"
    resp = client.post(
        "/ui/login",
        data={"token": tokens["alice"]},
        headers={"Origin": own, "Sec-Fetch-Site": "same-origin"},
    )
    assert resp.status_code == 303
    assert resp.cookies.get(TOKEN_COOKIE) == tokens["alice"]


# --- request bodies without a Content-Length ----------------------------------------------


def _chunks(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    """``total`` bytes of a JSON string body, sent chunked (no Content-Length)."""
    yield b'{"slug": "x", "name": "'
    sent = 0
    while sent < total:
        yield b"a" * size
        sent += size
    yield b'"}'


def test_a_chunked_body_past_the_limit_is_413_like_a_declared_one(
    cookie_api: tuple[httpx.Client, dict[str, str]],
) -> None:
    """A body sent chunked (no Content-Length) is counted as it arrives: 8 MiB passes the
    limit (then fails validation, 422), one chunk past it is 413 payload_too_large."""
    from api.app import MAX_BODY_BYTES

    client, tokens = cookie_api
    who = {"Authorization": f"Bearer {tokens['alice']}", "Content-Type": "application/json"}
    at_bound = MAX_BODY_BYTES - 64 * 1024  # the JSON framing brings it to just under
    resp = client.post("/v1/agents", content=_chunks(at_bound), headers=who)
    assert resp.status_code == 422, resp.text[:200]
    resp = client.post("/v1/agents", content=_chunks(MAX_BODY_BYTES + 1), headers=who)
    assert resp.status_code == 413, resp.text[:200]
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert resp.json()["code"] == "payload_too_large"


def test_the_console_cookie_is_secure_when_the_console_is_served_over_https(
    cookie_api: tuple[httpx.Client, dict[str, str]],
) -> None:
    """Behind a TLS proxy (X-Forwarded-Proto: https from the trusted loopback) the login
    cookie is Secure, so the browser never sends the token over plain HTTP; over plain
    HTTP (baton dev) it is not, or the console could not log in at all."""
    client, tokens = cookie_api
    own = f"{client.base_url.host}:{client.base_url.port}"
    over_tls = client.post(
        "/ui/login",
        data={"token": tokens["alice"]},
        headers={"X-Forwarded-Proto": "https", "Origin": f"https://{own}"},
    )
    assert over_tls.status_code == 303
    cookie = over_tls.headers["set-cookie"].lower()
    assert "secure" in cookie and "httponly" in cookie and "samesite=strict" in cookie
    plain = client.post("/ui/login", data={"token": tokens["alice"]})
    assert plain.status_code == 303
    assert "secure" not in plain.headers["set-cookie"].lower()


def test_console_pages_cannot_be_framed(cookie_api: tuple[httpx.Client, dict[str, str]]) -> None:
    """Every console page (the login and a logged-in page) forbids framing (CSP
    frame-ancestors 'none', X-Frame-Options DENY): a page of another origin could else
    frame the inbox, whose own clicks are same-origin, and trick a user into approving."""
    client, tokens = cookie_api
    for resp in (
        client.get("/ui/login"),
        client.get("/ui/inbox", headers=_as_browser(client, tokens["alice"])),
    ):
        assert resp.status_code == 200
        assert "frame-ancestors 'none'" in resp.headers["content-security-policy"]
        assert "default-src 'self'" in resp.headers["content-security-policy"]
        assert resp.headers["x-frame-options"] == "DENY"


def test_a_cross_origin_logout_is_refused(cookie_api: tuple[httpx.Client, dict[str, str]]) -> None:
    """A page elsewhere cannot log the console out (403, the cookie is kept); the
    console's own Log out button (same origin) still clears it."""
    client, _tokens = cookie_api
    evil = f"http://localhost:{(client.base_url.port or 80) + 1}"
    resp = client.post("/ui/logout", headers={"Origin": evil, "Sec-Fetch-Site": "same-site"})
    assert resp.status_code == 403
    assert "set-cookie" not in resp.headers
    resp = client.post("/ui/logout", headers={"Sec-Fetch-Site": "same-origin"})
    assert resp.status_code == 303
    assert f'{TOKEN_COOKIE}=""' in resp.headers["set-cookie"]
