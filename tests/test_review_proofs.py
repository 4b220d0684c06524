"""Proven review decisions and late decisions (Gamut X-Agent Policies).

The API and the worker sign every decision they send (HMAC-SHA256 keyed with
BATON_REVIEW_SECRET); ``settle_review`` records an unproven one, such as a raw
``temporal workflow signal``, as ``temporal (unverified)``, and in auth mode it
never saves a policy. A session remembers, across continue-as-new and bounded,
which decisions changed nothing and which reviews it settled.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy.engine import Engine
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from baton.contracts.workflow_io import (
    MAX_LATE_DECISIONS,
    MAX_SETTLED_REVIEWS,
    Provenance,
    ReviewDecision,
    SessionInput,
    UserMessage,
)
from baton.errors import InvalidSettings
from baton.permissions import reviews
from baton.runs import session_store
from baton.settings import (
    DEV_REVIEW_KEY,
    MIN_REVIEW_SECRET,
    MIN_REVIEW_SECRET_BITS,
    Settings,
    secret_entropy_bits,
)
from baton.storage.db import session_scope
from tests.conftest import venv_bin
from tests.helpers import (
    TEST_CONFIG,
    launch,
    publish,
    refused_start_line,
    status,
    transcript,
    wait_for,
)
from tests.test_api_agents import assert_problem
from tests.test_api_reviews import Stack, pending, poll, running_stack
from tests.test_api_reviews import decide as api_decide
from tests.test_api_reviews import launch as api_launch
from tests.test_api_reviews import settled as api_settled
from tests.test_auth import Users, add_user, create_agent, grant
from tests.xagent_helpers import (
    audit_rows,
    caller_playbook,
    decide,
    open_reviews,
    policy_rows,
    settled,
    setup_pair,
    tool_result,
)

INVOKE_SYNC = {"slug": "target", "prompt": "hello target", "sync": True}
UNKNOWN = "review-00000000-0000-4000-8000-00000000dead"


def signal_with_temporal_cli(address: str, session_id: str, payload: dict[str, Any]) -> None:
    """``temporal workflow signal --name review_decision`` (the real CLI binary)."""
    done = subprocess.run(
        [
            venv_bin("temporal"),
            "workflow",
            "signal",
            "--address",
            address,
            "--namespace",
            "default",
            "--workflow-id",
            session_id,
            "--name",
            "review_decision",
            "--input",
            json.dumps(payload),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)


async def late(client: Client, session_id: str, count: int) -> list[dict[str, Any]]:
    """Query ``late_decisions`` until it holds ``count`` entries; returns them."""
    handle = client.get_workflow_handle(session_id)
    for _ in range(600):
        found: list[dict[str, Any]] = await handle.query("late_decisions")
        if len(found) >= count:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"late_decisions of {session_id} never reached {count}")


# --- proofs and credit (unit) ------------------------------------------------------------


def test_a_proof_verifies_only_for_its_exact_claims_and_key() -> None:
    """A proof binds review id, decision, scope, decided_by and decision_id to the key."""
    key = b"k" * MIN_REVIEW_SECRET
    signed = reviews.prove(
        key,
        ReviewDecision(
            review_id="review-1", decision="allow_once", decided_by="alice", decision_id="d1"
        ),
    )
    assert reviews.is_proven(key, signed)
    assert signed.proof is not None and len(signed.proof) == 64
    for change in (
        {"review_id": "review-2"},
        {"decision": "always_allow"},
        {"scope": "all"},
        {"decided_by": "mallory"},
        {"decision_id": "d2"},
        {"decision_id": None},
        {"proof": None},
        {"proof": "0" * 64},
    ):
        assert not reviews.is_proven(key, signed.model_copy(update=change)), change
    assert not reviews.is_proven(DEV_REVIEW_KEY, signed)


def test_credit_takes_a_proven_decision_as_claimed_and_an_unproven_one_as_unverified() -> None:
    """Unproven: 'temporal (unverified)'; in auth mode its always_allow becomes allow_once."""
    forged = ReviewDecision(
        review_id="review-1", decision="always_allow", scope="all", decided_by="alice"
    )
    proven = reviews.credit(DEV_REVIEW_KEY, reviews.prove(DEV_REVIEW_KEY, forged), auth=True)
    assert (proven.decision, proven.decided_by, proven.proven, proven.reason) == (
        "always_allow",
        "alice",
        True,
        "always_allow",
    )
    in_auth = reviews.credit(DEV_REVIEW_KEY, forged, auth=True)
    assert (in_auth.decision, in_auth.decided_by, in_auth.proven) == (
        "allow_once",
        reviews.UNVERIFIED,
        False,
    )
    assert "applied as allow_once" in in_auth.reason and "'alice'" in in_auth.reason
    outside = reviews.credit(DEV_REVIEW_KEY, forged, auth=False)
    assert (outside.decision, outside.decided_by) == ("always_allow", reviews.UNVERIFIED)
    plain = reviews.credit(
        DEV_REVIEW_KEY, ReviewDecision(review_id="r", decision="deny"), auth=True
    )
    assert (plain.decision, plain.reason) == ("deny", "deny from an unverified Temporal Signal")


# --- the secret -------------------------------------------------------------------------


def test_the_review_secret_is_required_in_auth_mode_and_32_characters_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Auth mode without a secret, or a 31-character one, is refused; 32 is accepted."""
    monkeypatch.delenv("BATON_REVIEW_SECRET")
    with pytest.raises(InvalidSettings, match="BATON_REVIEW_SECRET is required"):
        Settings(_env_file=None, auth="on").review_key()
    assert Settings(_env_file=None).review_key() == DEV_REVIEW_KEY
    ok = secrets.token_urlsafe(24)  # 32 random characters
    short = ok[: MIN_REVIEW_SECRET - 1]
    assert len(ok) == MIN_REVIEW_SECRET
    for auth in ("off", "on"):
        with pytest.raises(ValidationError, match="at least 32 characters") as refused:
            Settings(_env_file=None, auth=auth, review_secret=short)
        assert short not in str(refused.value)
        assert Settings(_env_file=None, auth=auth, review_secret=ok).review_key() == ok.encode()
    assert ok not in repr(Settings(_env_file=None, review_secret=ok))


def test_a_review_secret_without_entropy_is_refused() -> None:
    """32 spaces, one character repeated (64 times) or a 32-character two-letter cycle are
    refused; the bound is 64 bits: four characters eight times each (exactly 64) pass, one more of
    one and one fewer of another (63.8) is refused; the message never holds the secret."""
    for weak in (" " * 32, "s" * 64, "ab" * 16):
        with pytest.raises(ValidationError, match="bits of entropy") as refused:
            Settings(_env_file=None, review_secret=weak)
        assert weak not in str(refused.value)
    at_bound = "abcd" * 8
    assert secret_entropy_bits(at_bound) == MIN_REVIEW_SECRET_BITS
    assert Settings(_env_file=None, review_secret=at_bound).review_key() == at_bound.encode()
    past = "a" * 9 + "b" * 7 + "c" * 8 + "d" * 8
    assert MIN_REVIEW_SECRET_BITS - 1 < secret_entropy_bits(past) < MIN_REVIEW_SECRET_BITS
    with pytest.raises(ValidationError, match="bits of entropy"):
        Settings(_env_file=None, review_secret=past)
    for generated in (secrets.token_hex(16), secrets.token_urlsafe(32)):
        assert Settings(_env_file=None, review_secret=generated).review_key()


def test_baton_worker_names_a_blank_review_secret_in_one_line(tmp_path: Path) -> None:
    """`baton worker` with BATON_REVIEW_SECRET of 32 spaces stops at start with exit 1 and
    one line naming the setting (it used to accept the key and run)."""
    line = refused_start_line(tmp_path, ["worker"], {"BATON_REVIEW_SECRET": " " * 32})
    assert line.startswith("error [invalid_settings]: BATON_REVIEW_SECRET: carries about 0")


@pytest.mark.parametrize(
    ("argv", "exit_code"),
    [
        (["cli", "api"], 1),
        (["cli", "worker"], 1),
        # The app factory itself (deployments may run it under uvicorn): its lifespan refuses.
        (["uvicorn", "api.app:create_app", "--factory", "--port", "0"], 3),
    ],
    ids=["baton-api", "baton-worker", "uvicorn-factory"],
)
def test_api_and_worker_refuse_to_start_in_auth_mode_without_a_secret(
    argv: list[str], exit_code: int, tmp_path: Path
) -> None:
    """`baton api`, `baton worker` and the API app with BATON_AUTH=on and no secret stop at
    start, saying why."""
    env = {
        "PATH": str(Path(sys.executable).parent),
        "HOME": str(tmp_path),
        "BATON_AUTH": "on",
        "BATON_DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}",
        "BATON_TEMPORAL_ADDRESS": "127.0.0.1:1",
    }
    done = subprocess.run(
        [sys.executable, "-m", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert done.returncode == exit_code, (done.stdout, done.stderr)
    assert "BATON_REVIEW_SECRET is required with BATON_AUTH=on" in done.stderr


# --- auth mode, end to end: a forged signal carries no proof -----------------------------------


@pytest.fixture
def auth_stack(temporal_env: WorkflowEnvironment, tmp_path: Path) -> Iterator[tuple[Users, Stack]]:
    """API + worker + dev server in auth mode (one review secret), with users alice and bob."""
    tokens: dict[str, str] = {}

    def prepare(engine: Engine) -> None:
        tokens.update({u: add_user(engine, u) for u in ("alice", "bob")})

    with running_stack(temporal_env, tmp_path / "proofs.db", prepare, auth="on") as st:
        users = Users(st.url, tokens)
        try:
            yield users, st
        finally:
            users.close()


def test_a_forged_always_allow_signal_in_auth_mode_allows_once_and_saves_no_policy(
    temporal_env: WorkflowEnvironment, auth_stack: tuple[Users, Stack]
) -> None:
    """Temporal CLI `always_allow, scope all, decided_by alice`: allowed once, unverified, no
    policy; through the API only the owner may always_allow: alice's is proven (audited as
    alice, policy saved) and the review it covers is resolved as the policy's, not unverified."""
    users, st = auth_stack
    alice = users["alice"]
    create_agent(alice, "target", [{"reply": "target says hi"}])
    create_agent(alice, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))
    first = api_launch(alice, "caller")
    (review,) = pending(alice)
    forged = {
        "review_id": review["id"],
        "decision": "always_allow",
        "scope": "all",
        "decided_by": "alice",
    }
    address = temporal_env.client.service_client.config.target_host
    signal_with_temporal_cli(address, first, forged)
    api_settled(alice, first)
    row = alice.get(f"/v1/reviews/{review['id']}").json()
    assert (row["status"], row["decision"], row["scope"], row["decided_by"]) == (
        "allowed",
        "allow_once",
        None,
        "temporal (unverified)",
    )
    (entry,) = alice.get("/v1/audit").json()["data"]
    assert (entry["outcome"], entry["decided_by"]) == ("allow", "temporal (unverified)")
    assert "applied as allow_once" in entry["reason"] and "'alice'" in entry["reason"]
    assert policy_rows(st.engine) == []
    policies = alice.get("/v1/agents/caller/policies").json()
    assert policies["global"]["invoke"] == "review"

    # The same decision through the API by alice, the caller's owner: proven, saved.
    second, third = api_launch(alice, "caller"), api_launch(alice, "caller")
    waiting = pending(alice, 2)
    by_session = {r["session_id"]: r for r in waiting}
    # Saving a policy is an owner's edit: bob, a user of the caller, may not.
    grant(st.engine, "caller", "bob", "user")
    bob_tries = api_decide(users["bob"], by_session[second]["id"], "always_allow", scope="all")
    assert_problem(bob_tries, 403, "forbidden")
    assert alice.get(f"/v1/reviews/{by_session[second]['id']}").json()["status"] == "pending"
    resp = api_decide(alice, by_session[second]["id"], "always_allow", scope="all")
    assert resp.status_code == 200, resp.text
    assert (resp.json()["decided_by"], resp.json()["decision"]) == ("alice", "always_allow")
    assert policy_rows(st.engine) == [("caller", None, "invoke", "allow")]
    covered = poll(
        lambda: (
            (r := alice.get(f"/v1/reviews/{by_session[third]['id']}").json())["status"] != "pending"
            and r
        ),
        "the covered review",
    )
    assert (covered["status"], covered["decided_by"]) == (
        "allowed",
        f"policy (always_allow on {by_session[second]['id']})",
    )
    audit = {e["review_id"]: e for e in alice.get("/v1/audit").json()["data"]}
    assert (
        audit[by_session[second]["id"]]["decided_by"],
        audit[by_session[second]["id"]]["reason"],
    ) == (
        "alice",
        "always_allow",
    )
    assert audit[by_session[third]["id"]]["decided_by"] == covered["decided_by"]


# --- the settle activity on the test worker (its key: DEV_REVIEW_KEY) -----------------------


async def test_a_wrongly_proven_deny_is_recorded_as_unverified(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A proof made with another key verifies nothing: the deny applies, as unverified."""
    setup_pair(db_engine, "invoke_agent", INVOKE_SYNC)
    run = await launch(temporal_env.client, db_engine, worker, "caller", "go", sync=False)
    (review,) = await open_reviews(temporal_env.client, db_engine, run.session_id)
    wrong = reviews.prove(
        b"x" * MIN_REVIEW_SECRET,
        ReviewDecision(review_id=review.id, decision="deny", decided_by="alice"),
    )
    await temporal_env.client.get_workflow_handle(run.session_id).signal("review_decision", wrong)
    row = await settled(db_engine, review.id)
    assert (row.status, row.decided_by) == ("denied", reviews.UNVERIFIED)
    (entry,) = audit_rows(db_engine)
    assert (entry.outcome, entry.decided_by) == ("denied_by_user", reviews.UNVERIFIED)
    await wait_for(lambda: status(db_engine, run.session_id) == "idle")
    assert "denied by temporal (unverified)" in transcript(db_engine, run.session_id)[-2][1]


async def test_outside_auth_mode_an_unproven_always_allow_saves_its_policy_unverified(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Auth off: a raw always_allow still saves the policy, but is recorded as unverified."""
    setup_pair(db_engine, "invoke_agent", INVOKE_SYNC)
    run = await launch(temporal_env.client, db_engine, worker, "caller", "go", sync=False)
    (review,) = await open_reviews(temporal_env.client, db_engine, run.session_id)
    await decide(
        temporal_env.client,
        review,
        "always_allow",
        proven=False,
        scope="target",
        decided_by="alice",
    )
    row = await settled(db_engine, review.id)
    assert (row.status, row.decision, row.scope, row.decided_by) == (
        "allowed",
        "always_allow",
        "target",
        reviews.UNVERIFIED,
    )
    assert policy_rows(db_engine) == [("caller", "target", "invoke", "allow")]
    await wait_for(lambda: status(db_engine, run.session_id) == "idle")
    assert tool_result(transcript(db_engine, run.session_id)[-1][1])["response"] == "target says hi"


# --- late decisions -------------------------------------------------------------------------


async def test_a_decision_for_an_unknown_review_is_reported_unknown_review(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """A Signal naming no review of the session: `unknown_review`; a settled one: `too_late`."""
    setup_pair(db_engine, "invoke_agent", INVOKE_SYNC)
    client = temporal_env.client
    run = await launch(client, db_engine, worker, "caller", "go", sync=False)
    (review,) = await open_reviews(client, db_engine, run.session_id)
    handle = client.get_workflow_handle(run.session_id)
    await handle.signal("review_decision", ReviewDecision(review_id=UNKNOWN, decision="deny"))
    await decide(client, review, "allow_once")
    await settled(db_engine, review.id)
    await decide(client, review, "deny")
    assert await late(client, run.session_id, 2) == [
        {"review_id": UNKNOWN, "decision": "deny", "reason": "unknown_review"},
        {"review_id": review.id, "decision": "deny", "reason": "too_late"},
    ]


async def test_late_decisions_keep_the_newest_50(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """50 late decisions are all kept; the 51st drops the oldest, never the newest."""
    publish(db_engine, "quiet", playbook=[{"reply": "ok"}])
    client = temporal_env.client
    run = await launch(client, db_engine, worker, "quiet", "hi", sync=True)
    handle = client.get_workflow_handle(run.session_id)
    ids = [f"review-{uuid.uuid4()}" for _ in range(MAX_LATE_DECISIONS + 1)]
    for rid in ids[:MAX_LATE_DECISIONS]:
        await handle.signal("review_decision", ReviewDecision(review_id=rid, decision="deny"))
    at_bound = await late(client, run.session_id, MAX_LATE_DECISIONS)
    assert [d["review_id"] for d in at_bound] == ids[:MAX_LATE_DECISIONS]
    await handle.signal("review_decision", ReviewDecision(review_id=ids[-1], decision="deny"))
    for _ in range(600):
        past = await handle.query("late_decisions")
        if past[-1]["review_id"] == ids[-1]:
            break
        await asyncio.sleep(0.05)
    assert [d["review_id"] for d in past] == ids[1:]


async def test_late_decisions_and_settled_reviews_survive_continue_as_new(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """After continue-as-new the late decisions are still reported and a decision for a review
    the previous run settled is `too_late`, not `unknown_review`."""
    setup_pair(db_engine, "invoke_agent", INVOKE_SYNC)
    client = temporal_env.client
    config = TEST_CONFIG.model_copy(update={"continue_as_new_after_turns": 1})
    run = await launch(client, db_engine, worker, "caller", "go", sync=False, config=config)
    handle = client.get_workflow_handle(run.session_id)
    first_run = (await handle.describe()).run_id
    (review,) = await open_reviews(client, db_engine, run.session_id)
    await handle.signal("review_decision", ReviewDecision(review_id=UNKNOWN, decision="deny"))
    await late(client, run.session_id, 1)  # received by the first run
    await decide(client, review, "allow_once")
    await settled(db_engine, review.id)

    async def continued() -> bool:
        return (await handle.describe()).run_id != first_run

    for _ in range(600):
        if await continued():
            break
        await asyncio.sleep(0.05)
    assert await continued(), "the session never continued-as-new"
    await decide(client, review, "deny")
    assert await late(client, run.session_id, 2) == [
        {"review_id": UNKNOWN, "decision": "deny", "reason": "unknown_review"},
        {"review_id": review.id, "decision": "deny", "reason": "too_late"},
    ]


async def test_a_session_remembers_the_newest_200_settled_reviews(
    temporal_env: WorkflowEnvironment, db_engine: Engine, worker: Worker
) -> None:
    """Carrying 200 settled ids, settling one more forgets the oldest (`unknown_review`) and
    keeps the next (`too_late`)."""
    setup_pair(db_engine, "invoke_agent", INVOKE_SYNC)
    client = temporal_env.client
    carried = [f"review-{uuid.uuid4()}" for _ in range(MAX_SETTLED_REVIEWS)]
    sid = f"session-{uuid.uuid4()}"
    with session_scope(db_engine) as s:
        session_store.create_session(
            s,
            session_id=sid,
            agent_slug="caller",
            agent_version=1,
            provenance=Provenance(),
            name="carried",
        )
    await client.start_workflow(
        "Session",
        SessionInput(
            session_id=sid,
            agent_pin="caller@1",
            config=TEST_CONFIG,
            first_message=UserMessage(prompt="go"),
            settled_reviews=carried,
        ),
        id=sid,
        task_queue=worker.task_queue,
    )
    (review,) = await open_reviews(client, db_engine, sid)
    handle = client.get_workflow_handle(sid)
    await handle.signal("review_decision", ReviewDecision(review_id=carried[0], decision="deny"))
    assert (await late(client, sid, 1))[0]["reason"] == "too_late"  # 200 held: all known
    await decide(client, review, "allow_once")
    await settled(db_engine, review.id)
    for rid in (carried[0], carried[1]):
        await handle.signal("review_decision", ReviewDecision(review_id=rid, decision="deny"))
    found = await late(client, sid, 3)
    assert [(d["review_id"], d["reason"]) for d in found[1:]] == [
        (carried[0], "unknown_review"),
        (carried[1], "too_late"),
    ]
    await wait_for(lambda: status(db_engine, sid) == "idle")
    await handle.cancel()


def test_the_carried_review_memory_is_bounded_in_the_contract() -> None:
    """SessionInput takes 200 settled ids and 50 late decisions; one more of either is refused."""
    late_one = {"review_id": UNKNOWN, "decision": "deny", "reason": "too_late"}
    ok = SessionInput(
        session_id="s",
        agent_pin="a@1",
        settled_reviews=["r"] * MAX_SETTLED_REVIEWS,
        late_decisions=[late_one] * MAX_LATE_DECISIONS,
    )
    assert (len(ok.settled_reviews), len(ok.late_decisions)) == (200, 50)
    with pytest.raises(ValidationError):
        SessionInput(session_id="s", agent_pin="a@1", settled_reviews=["r"] * 201)
    with pytest.raises(ValidationError):
        SessionInput(session_id="s", agent_pin="a@1", late_decisions=[late_one] * 51)
