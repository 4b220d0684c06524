"""The ``workspace_tool`` activity (docs/workspaces.md): one call of a built-in workspace tool
on the workspace the session works in.

Its input names the session, never a file's bytes, and its result is the stored tool
message's preview: the workspace store holds the files and the transcript the full
result (claim-check), so Temporal's payload limits never meet a file.
"""

from __future__ import annotations

import time

from sqlalchemy.engine import Engine
from temporalio import activity

from activities.outcomes import heartbeating_thread, store_call_result, stored_outcome
from baton.agents.tools import ToolError
from baton.contracts.activity_io import ToolInput, ToolOutcome
from baton.storage.db import session_scope
from baton.workspaces.store import WorkspaceStore, workspace_for
from baton.workspaces.tools import run_workspace_tool


class WorkspaceActivities:
    """Activities on session workspaces, built with the DB engine and the workspace store
    by the worker factory."""

    def __init__(self, engine: Engine, store: WorkspaceStore) -> None:
        self._engine = engine
        self._store = store

    @activity.defn(name="workspace_tool")
    def workspace_tool(self, inp: ToolInput) -> ToolOutcome:
        """Run one workspace tool call once (idempotent on its message id): its result, or
        its refusal (a bad path, a limit, a missing file) as a tool error the model reads."""
        with session_scope(self._engine) as s:
            done = stored_outcome(s, inp.message_id)
            if done is not None:
                return done
            workspace_id = workspace_for(s, inp.session_id)
        started = time.monotonic()
        try:
            with heartbeating_thread():
                workspace = self._store.workspace(workspace_id)
                output = run_workspace_tool(workspace, inp.call.name, inp.call.args)
            ok = True
        except ToolError as exc:
            output, ok = str(exc), False
        except Exception as exc:  # the store failed (disk, bucket): the model hears of it
            output, ok = f"tool '{inp.call.name}' failed: {type(exc).__name__}: {exc}", False
        elapsed_ms = int((time.monotonic() - started) * 1000)
        with session_scope(self._engine) as s:
            return store_call_result(s, inp, output, ok=ok, duration_ms=elapsed_ms)
