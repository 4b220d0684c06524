"""Late writes into a cancelled session: activities that finish or commit after the cancel
write no message, event or review (the cancel is the session's last word)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine
from temporalio.testing import ActivityEnvironment

from activities.turns import SessionActivities
from activities.xagent import XAgentActivities
from baton.contracts.activity_io import AuthorizeInput, ToolInput, ToolMessage, XAgentCall
from baton.contracts.values import ToolCall
from baton.contracts.workflow_io import Provenance
from baton.permissions import reviews
from baton.runs import session_store
from baton.storage.db import session_scope
from tests.helpers import publish


def _cancelled_session(engine: Engine) -> str:
    publish(engine, "echo", playbook=[{"reply": "hi"}])
    publish(engine, "other", playbook=[{"reply": "hi"}])
    with session_scope(engine) as s:
        session_store.create_session(
            s,
            session_id="session-late",
            agent_slug="echo",
            agent_version=1,
            provenance=Provenance(),
            name="late",
        )
    with session_scope(engine) as s:  # the cancel commits first ...
        session_store.set_status(s, session_id="session-late", status="cancelled")
    return "session-late"


def _after_cancel(engine: Engine, session_id: str) -> list[str]:
    with session_scope(engine) as s:
        kinds = [e.type for e in session_store.events_after(s, session_id=session_id)]
    return kinds[kinds.index("status") + 1 :]


def _tool(session_id: str, name: str, args: dict[str, Any], n: int = 0) -> ToolMessage:
    return ToolMessage(
        session_id=session_id,
        agent_slug="echo",
        message_id=f"{session_id}:t1:s1:tool{n}",
        position=f"000001.001.200{n}",
        call=ToolCall(id=f"c{n}", name=name, args=args),
    )


async def test_tool_results_never_land_after_cancelled(engine: Engine) -> None:
    """A tool activity that finishes after the session's cancel writes no message or event."""
    sid = _cancelled_session(engine)
    env = ActivityEnvironment()
    # ... and then the tool activities that were already running finish.
    env.run(
        SessionActivities(engine).run_tool,
        ToolInput(
            session_id=sid,
            agent_slug="echo",
            message_id=f"{sid}:t1:s1:tool0",
            position="000001.001.2000",
            call=ToolCall(id="c0", name="calculator", args={"expression": "1 + 1"}),
            allowed_tools=["calculator"],
        ),
    )
    xagent = XAgentActivities(engine, None)  # type: ignore[arg-type]  # list_agents needs no client
    await env.run(
        xagent.xagent_tool, XAgentCall(tool=_tool(sid, "list_agents", {}, 1), user="local")
    )
    with session_scope(engine) as s:
        assert session_store.get_session(s, session_id=sid).message_count == 0
    assert _after_cancel(engine, sid) == []


def test_authorize_opens_no_review_in_a_cancelled_session(engine: Engine) -> None:
    """An authorize that commits after the cancel opens no review and writes no event."""
    sid = _cancelled_session(engine)
    xagent = XAgentActivities(engine, None)  # type: ignore[arg-type]
    ActivityEnvironment().run(
        xagent.authorize,
        AuthorizeInput(
            tool=_tool(sid, "invoke_agent", {"slug": "other", "prompt": "hi"}),
            user="local",
            operation="invoke",
            target="other",
            review_id="review-late",
        ),
    )
    with session_scope(engine) as s:
        assert reviews.pending_in_session(s, session_id=sid) == 0
    assert _after_cancel(engine, sid) == []
