"""The workspace sharing rule (Xema Agent Concepts, ``workspaceSharing``; docs/workspaces.md,
Sharing): which workspace a session that a delegation starts works in."""

from __future__ import annotations

from typing import Literal

from baton.contracts.values import Via

#: Delegations whose target may work in its caller's workspace: a subagent ``task`` and
#: a ``delegate_to``, however it was made (the model's call, a team route, an @mention).
SHARING_KINDS: tuple[Via, ...] = ("task", "delegate_to", "route", "mention")


def workspace_of(
    *, kind: Via, sharing: Literal["isolated", "shareable"], caller_workspace: str
) -> str | None:
    """The workspace a delegated session works in: ``caller_workspace`` (the caller's own,
    or the one it shares in turn) when ``kind`` is one of :data:`SHARING_KINDS` and the
    target's resolved ``workspace_sharing`` is ``shareable``; None — its own — otherwise:
    ``isolated`` (the default, and what wins when ``extends`` layers disagree) and every
    ``invoke_agent`` session."""
    if kind in SHARING_KINDS and sharing == "shareable":
        return caller_workspace
    return None
