"""The console's registry pages (an agent's revisions, a team's editor) in Debian's
Chromium against the real API on a SQLite file; these pages need no worker.

Chromium comes from ``apt-get install chromium`` (.ci/run); it is never downloaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

from api.app import create_app
from baton.grants import auth
from baton.settings import Settings
from baton.storage.db import make_engine, session_scope
from tests.conftest import migrated, serve
from tests.test_console import browser, page  # noqa: F401  (the fixtures)


class AuthApi:
    """The API in auth mode: its base URL, a client, and a token per user."""

    def __init__(self, base: str, http: httpx.Client, tokens: dict[str, str], url: str) -> None:
        self.base = base
        self.http = http
        self.tokens = tokens
        self.url = url

    def headers(self, user: str) -> dict[str, str]:
        """The Authorization header of ``user``."""
        return {"Authorization": f"Bearer {self.tokens[user]}"}


@pytest.fixture
def auth_api(tmp_path: Path) -> Iterator[AuthApi]:
    """The real API in auth mode on a fresh SQLite file, with users alice and bob."""
    url = migrated(f"sqlite:///{tmp_path / 'registry.db'}")
    engine = make_engine(url)
    tokens = {}
    with session_scope(engine) as s:
        for user in ("alice", "bob"):
            auth.create_user(s, user_id=user)
            tokens[user] = auth.issue_token(s, user_id=user)[1]
    engine.dispose()
    server, thread, base = serve(create_app(Settings(database_url=url, auth="on")))
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            yield AuthApi(base, http, tokens, url)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _login(on: Page, api: AuthApi, user: str) -> None:
    on.goto(f"{api.base}/ui/login")
    on.get_by_label("API token").fill(api.tokens[user])
    on.get_by_role("button", name="Log in").click()
    on.wait_for_url(f"{api.base}/ui/inbox")


def test_the_publisher_of_a_revision_is_recorded_and_shown(
    auth_api: AuthApi,
    page: Page,  # noqa: F811  (the fixture imported above)
) -> None:
    """A revision alice publishes in auth mode records her: the API's revision says
    published_by alice and the agent page's By column shows alice."""
    alice = auth_api.headers("alice")
    spec = {"playbook": [{"reply": "hi"}]}
    body = {"slug": "memo", "name": "memo", "spec": spec}
    assert auth_api.http.post("/v1/agents", json=body, headers=alice).status_code == 201
    published = auth_api.http.post("/v1/agents/memo/publish", headers=alice)
    assert published.status_code == 201, published.text
    assert published.json()["published_by"] == "alice"
    listed = auth_api.http.get("/v1/agents/memo/revisions", headers=alice).json()["data"]
    assert [(r["version"], r["published_by"]) for r in listed] == [(1, "alice")]
    _login(page, auth_api, "alice")
    page.goto(f"{auth_api.base}/ui/agents/memo")
    expect(page.locator('#revisions tr[data-version="1"] .published-by')).to_have_text("alice")


def test_auth_off_records_local_as_the_publisher(api: httpx.Client) -> None:
    """With auth off a publish records the publisher as local."""
    body = {"slug": "memo", "name": "memo", "spec": {"playbook": [{"reply": "hi"}]}}
    assert api.post("/v1/agents", json=body).status_code == 201
    assert api.post("/v1/agents/memo/publish").json()["published_by"] == "local"
    assert api.get("/v1/agents/memo/revisions/1").json()["published_by"] == "local"


def test_only_an_owner_of_every_member_gets_the_team_editor(
    auth_api: AuthApi,
    page: Page,  # noqa: F811  (the fixture imported above)
) -> None:
    """In auth mode alice, who owns every member, gets the team editor; bob, a viewer of
    them, reads the team with a note and no Save button."""
    alice = auth_api.headers("alice")
    for slug in ("boss", "aide"):
        body = {"slug": slug, "name": slug, "spec": {"playbook": [{"reply": "ok"}]}}
        assert auth_api.http.post("/v1/agents", json=body, headers=alice).status_code == 201
        assert auth_api.http.post(f"/v1/agents/{slug}/publish", headers=alice).is_success
    team = {
        "id": "pair",
        "name": "Pair",
        "supervisor_agent_id": "boss",
        "members": [{"agent_id": "boss", "role": "supervisor"}, {"agent_id": "aide"}],
    }
    assert auth_api.http.post("/v1/teams", json=team, headers=alice).status_code == 201
    engine = make_engine(auth_api.url)
    try:
        with session_scope(engine) as s:
            for slug in ("boss", "aide"):
                auth.grant(s, agent=slug, user_id="bob", role="viewer")
    finally:
        engine.dispose()
    _login(page, auth_api, "alice")
    page.goto(f"{auth_api.base}/ui/teams/pair")
    expect(page.get_by_role("button", name="Save the team")).to_be_visible()
    page.get_by_role("button", name="Log out").click()
    _login(page, auth_api, "bob")
    page.goto(f"{auth_api.base}/ui/teams/pair")
    expect(page.get_by_role("note")).to_contain_text("Only an owner of every member of pair")
    expect(page.get_by_role("button", name="Save the team")).to_have_count(0)
