"""The run's search attributes in the Temporal UI (docs/operations.md): their keys and
the values a session or a step starts with."""

from __future__ import annotations

from typing import Literal

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

from baton.contracts.workflow_io import SessionInput, StepInput

#: Keyword search attributes (docs/operations.md, The run in the Temporal UI); registered
#: by the stack.
SA_AGENT = SearchAttributeKey.for_keyword("BatonAgent")
SA_VERSION = SearchAttributeKey.for_keyword("BatonAgentVersion")
SA_INVOKED_BY = SearchAttributeKey.for_keyword("BatonInvokedBy")
SA_STATUS = SearchAttributeKey.for_keyword("BatonStatus")
SA_USER = SearchAttributeKey.for_keyword("BatonUser")
SA_PARENT = SearchAttributeKey.for_keyword("BatonParentSession")
SA_TEAM = SearchAttributeKey.for_keyword("BatonTeam")
#: The root session of the run tree (a root session's own id; a step's
#: own id), on every session and step, so ``BatonRoot = "session-…"`` lists a whole run.
SA_ROOT = SearchAttributeKey.for_keyword("BatonRoot")
#: What a workflow is: ``session`` | ``step`` | ``eval`` (an eval's replay session, and the
#: eval's own workflow).
SA_KIND = SearchAttributeKey.for_keyword("BatonKind")
SEARCH_ATTRIBUTES = (
    SA_AGENT,
    SA_VERSION,
    SA_INVOKED_BY,
    SA_STATUS,
    SA_USER,
    SA_PARENT,
    SA_TEAM,
    SA_ROOT,
    SA_KIND,
)
WorkflowKind = Literal["session", "step", "eval"]


def _pinned_attributes(
    kind: WorkflowKind, pin: str, user: str, root: str
) -> list[SearchAttributePair[str]]:
    slug, _, version = pin.partition("@")
    return [
        SearchAttributePair(SA_KIND, kind),
        SearchAttributePair(SA_AGENT, slug),
        SearchAttributePair(SA_VERSION, version),
        SearchAttributePair(SA_USER, user),
        SearchAttributePair(SA_STATUS, "running"),
        SearchAttributePair(SA_ROOT, root),
    ]


def initial_search_attributes(inp: SessionInput) -> TypedSearchAttributes:
    """The search attributes a session starts with (set by whoever starts it): BatonKind
    ``session`` (``eval`` for an eval's replay), agent, version, user, status ``running``,
    BatonRoot (the run's root session, this one's id for a root), and when set
    BatonInvokedBy, BatonParentSession, BatonTeam."""
    root = inp.provenance.root_session_id or inp.session_id
    kind: WorkflowKind = "eval" if inp.provenance.eval_id else "session"
    pairs = _pinned_attributes(kind, inp.agent_pin, inp.provenance.created_by_user, root)
    for key, value in (
        (SA_INVOKED_BY, inp.provenance.invoked_by_agent),
        (SA_PARENT, inp.provenance.parent_session_id),
        (SA_TEAM, inp.provenance.team),
    ):
        if value:
            pairs.append(SearchAttributePair(key, value))
    return TypedSearchAttributes(pairs)


def step_search_attributes(inp: StepInput) -> TypedSearchAttributes:
    """The search attributes a step starts with: BatonKind ``step``,
    agent, version (``inp.agent_pin`` must be a pin), user, status ``running`` and
    BatonRoot (the step's own id: a step is a tree of its own). The step workflow keeps
    BatonStatus up to date (running | awaiting_handoff | completed | failed | rejected)."""
    return TypedSearchAttributes(_pinned_attributes("step", inp.agent_pin, inp.user, inp.step_id))


def eval_search_attributes(slug: str, user: str) -> TypedSearchAttributes:
    """The search attributes of an eval's own workflow: BatonKind ``eval``, agent, user."""
    return TypedSearchAttributes(
        [
            SearchAttributePair(SA_KIND, "eval"),
            SearchAttributePair(SA_AGENT, slug),
            SearchAttributePair(SA_USER, user),
        ]
    )
