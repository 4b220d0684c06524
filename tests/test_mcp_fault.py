"""A worker killed (SIGKILL) while an MCP invoke_agent is in flight: the
call is an Update on the caller's workflow, so a new worker finishes it, exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

from sqlmodel import col, select
from temporalio.testing import WorkflowEnvironment

from api.app import create_app
from baton.contracts.workflow_io import Provenance, SessionConfig
from baton.grants import policies
from baton.runs.external import open_external_session
from baton.settings import Settings
from baton.storage.db import DelegationRow, SessionRow, init_db, make_engine, session_scope
from tests.conftest import serve
from tests.helpers import publish, transcript, wait_for
from tests.test_fault import chunk_count, start_worker
from tests.test_mcp_external import mcp_client, text
from worker.stack import stop_process

REPLY = " ".join(f"word{i}" for i in range(40))


async def test_killed_worker_during_an_mcp_invoke_runs_the_target_once(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """SIGKILL while the target streams its reply for a sync MCP invoke; a new worker
    completes the call: the MCP client gets the reply, and there is one target session,
    one delegation and one reply."""
    db_url = f"sqlite:///{tmp_path / 'mcp-fault.db'}"
    engine = make_engine(db_url)
    init_db(engine)
    publish(engine, "outside")
    publish(engine, "streamer", playbook=[{"reply": REPLY, "chunk_delay_ms": 60}])
    with session_scope(engine) as s:
        policies.save_policy(
            s, caller="outside", operation="invoke", target="streamer", decision="allow"
        )
    queue = f"tq-{uuid.uuid4()}"
    address = temporal_env.client.service_client.config.target_host
    env = {
        **os.environ,
        "BATON_DATABASE_URL": db_url,
        "BATON_TEMPORAL_ADDRESS": address,
        "BATON_TASK_QUEUE": queue,
    }
    settings = Settings(database_url=db_url, temporal_address=address, task_queue=queue)
    server, thread, base = serve(create_app(settings))
    first = start_worker(env)
    second: subprocess.Popen[bytes] | None = None
    try:
        opened = await open_external_session(
            temporal_env.client,
            engine,
            task_queue=queue,
            config=SessionConfig(heartbeat_timeout_s=2.0),
            ref="outside",
            provenance=Provenance(),
        )

        async def invoke() -> tuple[bool, str]:
            async with mcp_client(f"{base}/mcp", opened.proxy_token) as session:
                args = {"slug": "streamer", "prompt": "talk", "sync": True}
                result = await session.call_tool("invoke_agent", args)
                return bool(result.is_error), text(result)

        call = asyncio.create_task(invoke())

        def target_ids() -> list[str]:
            with session_scope(engine) as s:
                rows = s.exec(select(SessionRow).where(SessionRow.agent_slug == "streamer"))
                return [r.id for r in rows]

        await wait_for(lambda: bool(target_ids()), timeout=60)
        await wait_for(lambda: chunk_count(engine, target_ids()[0]) >= 3, timeout=60)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        assert not call.done()

        second = start_worker(env)
        failed, body = await asyncio.wait_for(call, timeout=120)
        assert not failed, body
        assert json.loads(body)["response"] == REPLY
        assert len(target_ids()) == 1
        replies = [r for r, _ in transcript(engine, target_ids()[0]) if r == "assistant"]
        assert replies == ["assistant"]
        with session_scope(engine) as s:
            delegations = s.exec(
                select(DelegationRow).where(
                    col(DelegationRow.parent_session_id) == opened.session_id
                )
            ).all()
            assert [d.status for d in delegations] == ["completed"]
    finally:
        for proc in (first, second):
            stop_process(proc)
        server.should_exit = True
        thread.join(timeout=10)
        engine.dispose()
