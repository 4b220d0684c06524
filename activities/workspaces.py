"""The ``workspace_tool`` activity (docs/workspaces.md): one call of a built-in workspace tool
on the workspace the session works in.

Its input names the session, never a file's bytes: a ``write_file`` call arrives
claim-checked (its content's size and the id of the assistant message that stored the
whole arguments, read back here). Its result is the stored tool message's preview: the
workspace store holds the files and the transcript the full result (claim-check), so
Temporal's payload limits never meet a file.
"""

from __future__ import annotations

import time

from sqlalchemy.engine import Engine
from temporalio import activity

from activities.outcomes import (
    claimed_args,
    heartbeating_thread,
    store_call_result,
    stored_outcome,
)
from baton.agents.tools import ToolError
from baton.contracts.activity_io import ToolInput, ToolOutcome
from baton.contracts.tool_args import compact_args
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
        its refusal (a bad path, a limit, a missing file) as a tool error the model reads.
        A claim-checked call's whole arguments are read from its stored assistant message;
        its tool message keeps their compact form."""
        with session_scope(self._engine) as s:
            done = stored_outcome(s, inp.message_id)
            if done is not None:
                return done
            workspace_id = workspace_for(s, inp.session_id)
            args = claimed_args(s, inp)
        started = time.monotonic()
        try:
            with heartbeating_thread():
                workspace = self._store.workspace(workspace_id)
                output = run_workspace_tool(workspace, inp.call.name, args)
            ok = True
        except ToolError as exc:
            output, ok = str(exc), False
        except Exception as exc:  # the store failed (disk, bucket): the model hears of it
            output, ok = f"tool '{inp.call.name}' failed: {type(exc).__name__}: {exc}", False
        elapsed_ms = int((time.monotonic() - started) * 1000)
        with session_scope(self._engine) as s:
            kept = compact_args(inp.call.name, args)
            return store_call_result(s, inp, output, ok=ok, duration_ms=elapsed_ms, tool_args=kept)
