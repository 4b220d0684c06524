"""A file a person attached to a session's workspace, told to the session
(docs/workspaces.md, Attach a file): a ``workspace_attached`` event for the console and an
``attachment`` message the agent reads at its next model call."""

from __future__ import annotations

import uuid

from sqlmodel import Session

from baton.contracts.workspaces import FileInfo
from baton.runs import run_tree, session_store

#: The event a person's upload appends to the session's stream.
WORKSPACE_ATTACHED = "workspace_attached"


def attachment_note(info: FileInfo, by: str) -> str:
    """What the agent reads about an attached file (one line)."""
    return (
        f"[{by} attached '{info.path}' to the workspace: {info.size} bytes, "
        f"{info.content_type}; read it with read_file]"
    )


def record_attachment(s: Session, *, session_id: str, info: FileInfo, by: str) -> str:
    """Record that ``by`` attached ``info`` to ``session_id``'s workspace: an ``attachment``
    message placed before the session's next turn (after every message stored so far, so
    a running turn's tool calls keep their results) and a ``workspace_attached`` event
    ``{path, size, content_type, modified, by, message_id}``, forwarded unchanged to the
    run's root when the session runs a delegation. Returns the message id.
    Raises SessionNotFound."""
    message_id = f"{session_id}:attach:{uuid.uuid4().hex}"
    turn = session_store.newest_turn(s, session_id=session_id) + 1
    session_store.add_message(
        s,
        message_id=message_id,
        session_id=session_id,
        # Before position(turn, 0, 0), the next turn's user message, and after all else.
        position=f"{turn:06d}.000.0",
        role="attachment",
        agent_slug="",
        text=attachment_note(info, by),
    )
    data = {**info.model_dump(mode="json"), "by": by, "message_id": message_id}
    session_store.append_event(s, session_id=session_id, type=WORKSPACE_ATTACHED, data=data)
    # A delegated session's attachment shows in its run's root as well, unchanged
    # (AgentX Agent Teams, 'Multimodal specialist output passes through').
    run_tree.forward_top_level(s, session_id, WORKSPACE_ATTACHED, data)
    return message_id
