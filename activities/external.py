"""Activities of external sessions (docs/mcp.md): store the messages an outside
process posts to its own transcript, under the id and position its workflow chose."""

from __future__ import annotations

from sqlalchemy.engine import Engine
from temporalio import activity

from baton.contracts.activity_io import ExternalMessageInput
from baton.runs import session_store
from baton.storage.db import session_scope


class ExternalActivities:
    """Built with the DB engine (worker/factory.py)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @activity.defn(name="record_external_message")
    def record_external_message(self, inp: ExternalMessageInput) -> bool:
        """Store the message once (a retry finds it); nothing once the session closed.

        Returns whether it was stored by this attempt.
        """
        with session_scope(self._engine) as s:
            if session_store.is_closed(s, session_id=inp.session_id):
                return False
            return session_store.add_message(
                s,
                message_id=inp.message_id,
                session_id=inp.session_id,
                position=inp.position,
                role=inp.role,
                agent_slug=inp.agent_slug,
                text=inp.text,
            )
