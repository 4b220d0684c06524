"""Links into the Temporal Web UI, and the markdown Baton puts there.

Delegated sessions are started by the ``delegate`` activity, not as child workflows, so
the UI's Relationships tab cannot show a run's tree, and this SDK (temporalio 1.35)
attaches workflow event links only inside a Nexus operation. What the UI does show and
navigate is each workflow's *user metadata*: the static summary and details set at start
and the current details a workflow sets as it runs, all rendered as markdown (links open
in a new tab). So every session's static details link its parent, its run's root, the
list of the sessions it delegated to (``BatonParentSession = "…"``) and the whole run
tree (``BatonRoot = "…"``); a step's link its agent's steps.

Links inside the UI are *relative* (``namespaces/NS/workflows/ID``): the UI renders
markdown in a frame served at ``<ui base>/render``, so they resolve against whatever
address and path prefix the operator reached the UI at, with no setting to keep in
step. Links printed outside the UI (``baton trace``, ``GET /v1/sessions/{id}/trace``)
are absolute, from ``BATON_TEMPORAL_UI_URL`` (:meth:`baton.settings.Settings.workflow_url`).

Pure (no I/O, no settings): used by the API, the CLI, the launch code and workflow code.
"""

from __future__ import annotations

import functools
import re
from urllib.parse import quote

from baton.contracts.search import SA_AGENT, SA_KIND, SA_PARENT, SA_ROOT, SA_STATUS
from baton.contracts.workflow_io import Provenance

#: Characters markdown gives a meaning to inside a line; :func:`md_text` escapes them
#: (``-``, ``+``, ``.`` only mean something at a line's start, where Baton never puts text).
_MARKDOWN = re.compile(r"([\\`*_{}\[\]()<>#!|~&])")


def workflow_path(namespace: str, workflow_id: str) -> str:
    """``namespaces/NS/workflows/ID``: a workflow's page (its latest run), relative to
    the UI's base URL."""
    return f"namespaces/{quote(namespace, safe='')}/workflows/{quote(workflow_id, safe='')}"


def workflows_path(namespace: str, query: str) -> str:
    """``namespaces/NS/workflows?query=…``: the workflow list filtered by a visibility
    query (``BatonRoot = "session-…"``), relative to the UI's base URL."""
    return f"namespaces/{quote(namespace, safe='')}/workflows?query={quote(query, safe='')}"


def absolute(base: str, path: str) -> str:
    """``path`` (from :func:`workflow_path` / :func:`workflows_path`) under the UI's
    ``base`` URL (``http://localhost:8233``, maybe with a path prefix)."""
    return f"{base.rstrip('/')}/{path}"


def equals(attribute: str, value: str) -> str:
    """``Attribute = "value"``, a visibility query term. Baton's values are ids, slugs and
    statuses (no quotes); a quote or backslash in ``value`` is escaped anyway."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'{attribute} = "{escaped}"'


def tree_query(root_session_id: str) -> str:
    """Every session of one run (and the steps: a step is its own root)."""
    return equals(SA_ROOT.name, root_session_id)


def children_query(session_id: str) -> str:
    """The sessions ``session_id`` delegated to (every kind of delegation)."""
    return equals(SA_PARENT.name, session_id)


def agent_query(slug: str) -> str:
    """One agent's sessions and steps."""
    return equals(SA_AGENT.name, slug)


#: Sessions an operator must act on: a policy review waits (BatonStatus is coarse on
#: purpose, see workflows/session.py).
AWAITING_REVIEW_QUERY = equals(SA_STATUS.name, "awaiting_input")
#: Steps that ended failed or rejected (their workflows fail).
FAILED_STEPS_QUERY = f'{equals(SA_KIND.name, "step")} AND ExecutionStatus = "Failed"'


def md_text(text: str) -> str:
    """``text`` with markdown's special characters escaped, on one line: model output,
    prompts and names show as they are, never as links, emphasis or HTML."""
    return _MARKDOWN.sub(r"\\\1", " ".join(text.split()))


def md_link(label: str, path: str) -> str:
    """A markdown link with an escaped label."""
    return f"[{md_text(label)}]({path})"


def session_details(*, namespace: str, session_id: str, pin: str, provenance: Provenance) -> str:
    """The static details of a session's workflow (markdown): who started it, how it was
    delegated and by whom, links to its parent, its run's root, the sessions it delegated
    to and its whole run tree."""
    root = provenance.root_session_id or session_id
    page = functools.partial(workflow_path, namespace)
    listed = functools.partial(workflows_path, namespace)
    lines = [f"Session of `{pin}`, started by {md_text(provenance.created_by_user)}."]
    if provenance.external:
        lines[0] = (
            f"External session of `{pin}`, owned by {md_text(provenance.created_by_user)}: "
            "its X-Agent calls arrive over MCP."
        )
    parent = provenance.parent_session_id
    if parent:
        how = provenance.delegation_kind or "invoke"
        by = provenance.invoked_by_agent or "?"
        lines.append(
            f"**Parent**: {md_link(parent, page(parent))} — {how} by `{by}`, "
            f"depth {provenance.depth}."
        )
    elif provenance.invoked_by_agent:
        lines.append(f"Invoked by `{provenance.invoked_by_agent}`.")
    if provenance.team:
        lines.append(f"**Team**: `{provenance.team}`.")
    if provenance.forked_from:
        original = provenance.forked_from
        lines.append(
            f"**Forked from**: {md_link(original, page(original))} after message "
            f"{md_text(provenance.fork_point or '?')}"
            + (" — sandbox (runs the draft)." if provenance.sandbox else ".")
        )
    if root not in (session_id, parent):
        lines.append(f"**Run root**: {md_link(root, page(root))}.")
    children, tree = children_query(session_id), tree_query(root)
    started = md_link("sessions this one started", listed(children))
    lines.append(f"**Delegated sessions**: {started} (`{children}`).")
    lines.append(f"**Run tree**: {md_link('every session of this run', listed(tree))} (`{tree}`).")
    return "\n\n".join(lines)


def step_details(*, namespace: str, step_id: str, pin: str, user: str, handoff: bool) -> str:
    """The static details of a step's workflow (markdown): agent, who started it, whether
    a human hands it off, and links to the agent's runs and to every failed step."""
    slug = pin.partition("@")[0]
    listed = functools.partial(workflows_path, namespace)
    runs = md_link(f"every session and step of {slug}", listed(agent_query(slug)))
    failed = md_link("every failed or rejected step", listed(FAILED_STEPS_QUERY))
    handed = ", with a human handoff." if handoff else "."
    lines = [
        f"Workflow-agent step of `{pin}`, started by {md_text(user)}{handed}",
        f"**Agent's runs**: {runs}.",
        f"**Failed steps**: {failed}.",
        f"In the API: `GET /v1/steps/{step_id}` and `GET /v1/steps/{step_id}/transcript`.",
    ]
    return "\n\n".join(lines)
