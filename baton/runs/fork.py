"""Fork a session (docs/change-safely.md, Fork a session): a new session whose transcript is
another's up to and including one message, then runs from there.

The prefix is held by reference, never copied: the fork's row lists the stretches of
other sessions it reads through (:class:`~baton.runs.session_store.Segment`), so forking
a 10,000-message session writes one row, and every transcript read (the API's pages,
the model's context window) reads the stretches it reaches by index. The original is
never written.

What the fork runs first (its one automatic turn), for the fork point ``M``:

- ``M`` is a user message: the answer to ``M`` (``M`` is in the prefix and is not stored
  again). ``prompt`` is refused (``prompt_after_user_message``): to replace ``M``, fork
  after the message before it.
- otherwise: a turn on ``prompt``, or without one on the original's next user message
  after ``M`` (its text, sent again); 422 ``fork_needs_prompt`` when there is none.

Its turns number on from ``M``'s turn, so its own messages sort after the prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlmodel import Session

from baton.contracts.values import ResolvedAgent
from baton.contracts.workflow_io import Provenance
from baton.errors import BatonError
from baton.runs import launch, session_store
from baton.runs.session_store import Segment
from baton.storage.db import MessageRow, SessionRow

#: The ``agent`` reference of an agent's draft: ``slug@draft`` (the sandbox only).
DRAFT_VERSION = "draft"


class UnknownMessage(BatonError):
    """``after_message_id`` names no stored message."""

    code = "unknown_message"
    status = 422
    title = "Unknown message"


class MessageOfAnotherSession(BatonError):
    """``after_message_id`` names a message outside the session's transcript."""

    code = "message_of_another_session"
    status = 422
    title = "Message of another session"


class PromptAfterUserMessage(BatonError):
    """A fork after a user message answers that message: it takes no prompt."""

    code = "prompt_after_user_message"
    status = 422
    title = "Prompt after a user message"


class ForkNeedsPrompt(BatonError):
    """A fork after the original's last turn has no next user message to run."""

    code = "fork_needs_prompt"
    status = 422
    title = "Fork needs a prompt"


class DraftOutsideSandbox(BatonError):
    """A draft runs only in the authoring sandbox (a fork with ``sandbox: true``)."""

    code = "draft_outside_sandbox"
    status = 422
    title = "Draft outside the sandbox"


class ForkOfOtherAgent(BatonError):
    """A fork runs a revision (or the draft) of the original's agent, never another agent:
    whoever may read the fork reads its prefix, and the readers of a session are those
    of its agent, so a fork keeps the original's audience."""

    code = "fork_of_other_agent"
    status = 422
    title = "Fork of another agent"


@dataclass(frozen=True)
class ForkPlan:
    """Where a fork starts: its prefix (stretches, oldest first), the fork point, the
    turn its transcript reaches, and its first turn's message (``in_transcript``: the
    fork point itself, answered and not stored again)."""

    prefix: list[Segment]
    point: MessageRow
    turn: int
    prompt: str
    in_transcript: bool


def plan(
    s: Session, *, original: SessionRow, after_message_id: str, prompt: str | None
) -> ForkPlan:
    """The fork of ``original`` after ``after_message_id`` (the rule in the module's
    docstring). Reads only: the original is never written.

    Raises UnknownMessage, MessageOfAnotherSession, PromptAfterUserMessage and
    ForkNeedsPrompt (all 422).
    """
    point = session_store.get_message(s, message_id=after_message_id)
    if point is None:
        raise UnknownMessage(f"no message '{after_message_id[:160]}'", path="after_message_id")
    segs = session_store.segments(s, session_id=original.id)
    held = next((i for i, seg in enumerate(segs) if seg.holds(point)), None)
    if held is None:
        raise MessageOfAnotherSession(
            f"message '{after_message_id[:160]}' is not in session '{original.id}'",
            path="after_message_id",
        )
    prefix = [*segs[:held], Segment(point.session_id, point.position, point.id)]
    turn = int(point.position.split(".", 1)[0])
    if point.role == "user":
        if prompt is not None:
            raise PromptAfterUserMessage(
                "a fork after a user message answers it; to replace it, fork after the "
                "message before it",
                path="prompt",
            )
        return ForkPlan(prefix, point, turn, point.text, in_transcript=True)
    if prompt is None:
        following = session_store.read_messages(s, segs, after=point, limit=1, role="user")
        if not following:
            raise ForkNeedsPrompt(
                "the original has no user message after this one: send a prompt",
                path="prompt",
            )
        prompt = following[0].text
    return ForkPlan(prefix, point, turn, prompt, in_transcript=False)


def agent_ref(original: SessionRow, wanted: str | None, sandbox: bool) -> str:
    """The ref a fork of ``original`` runs: ``wanted`` or the original's own pin (its draft
    for a sandbox session). A fork runs a revision or the draft of the original's agent
    only (422 ForkOfOtherAgent: whoever reads the fork reads its prefix), and the draft
    only in the sandbox (422 DraftOutsideSandbox)."""
    draft = original.agent_version == 0  # a sandbox session's pin is the draft
    default = DRAFT_VERSION if draft else str(original.agent_version)
    ref = wanted or f"{original.agent_slug}@{default}"
    if ref.partition("@")[0] != original.agent_slug:
        raise ForkOfOtherAgent(
            f"a fork runs a revision of '{original.agent_slug}' (or its draft)", path="agent"
        )
    if ref.endswith(f"@{DRAFT_VERSION}") and not sandbox:
        raise DraftOutsideSandbox(
            "a draft runs only in the authoring sandbox: send sandbox: true", path="agent"
        )
    return ref


def name_of(original: SessionRow) -> str:
    """A fork's name: the original's, marked."""
    return f"Fork · {original.name}"[:200]


def provenance(original: SessionRow, fork: ForkPlan, *, user: str, sandbox: bool) -> Provenance:
    """A fork's provenance: started by ``user`` as its own run (a root: budgets, the
    balance and reviews apply to it afresh), with its lineage."""
    return Provenance(
        created_by_user=user,
        forked_from=original.id,
        fork_point=fork.point.id,
        sandbox=sandbox,
    )


def record(
    s: Session,
    *,
    session_id: str,
    original: SessionRow,
    fork: ForkPlan,
    agent: ResolvedAgent,
    prov: Provenance,
    idempotent: bool,
) -> launch.Recorded:
    """Record the fork's session row in ``s`` (:func:`baton.runs.launch.record_session`)
    with its lineage and prefix; its message count starts at the prefix's. A draft's
    snapshot is always recorded (no worker resolves ``slug@draft``)."""
    draft = agent.version == 0
    recorded = launch.record_session(
        s,
        session_id=session_id,
        ref=f"{agent.slug}@{agent.version}",
        prompt=fork.prompt,
        provenance=prov,
        name=name_of(original),
        idempotent=idempotent,
        agent=agent if draft else None,
        resolved=None if draft else agent,
    )
    row = session_store.get_session(s, session_id=recorded.session_id)
    if row.forked_from is None:  # not a keyed retry's row, recorded already
        row.forked_from = original.id
        row.fork_point = fork.point.id
        row.fork_prefix = [list(seg) for seg in fork.prefix]
        row.sandbox = prov.sandbox
        row.message_count = session_store.count_messages(s, fork.prefix)
        s.add(row)
        s.flush()
    return recorded
