"""The agent registry: identities, drafts, immutable revisions, the live pointer.

Keyword-only data-access functions over a SQLModel ``Session``, shared by the
API, the CLI and (later) activities. They flush but never commit: the caller
owns the transaction, so a publish, or a whole ``baton apply`` file, is one
transaction (docs/agents.md; Xema Agent Concepts, 'Identity, drafts, revisions, and rollback').
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from sqlalchemy import func, text
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from baton.agents import gate as evals_gate
from baton.agents.layers import LoadedRevision, Lookup, Resolver
from baton.agents.schemas import AgentPublic, BasePin, RevisionPublic
from baton.agents.spec import (
    AgentSpec,
    check_tree_shape,
    iter_tree,
    parse_ref,
    spec_digest,
    with_paths,
)
from baton.contracts.evals import PublishGate
from baton.contracts.values import CLOSED_STATUSES, ResolvedAgent, ResolvedNode
from baton.errors import (
    AgentExists,
    AgentInUse,
    AgentNotFound,
    AgentNotPublished,
    AgentRetired,
    BatonError,
    ConcurrentModification,
    InvalidReference,
    InvalidSpec,
    RevisionNotFound,
)
from baton.grants import auth, policies
from baton.storage.db import (
    Agent,
    AgentDraft,
    AgentLivePointer,
    AgentRevision,
    SessionRow,
    TeamRow,
    page,
    utcnow,
)


def _dump(spec: AgentSpec) -> dict[str, object]:
    return spec.model_dump(mode="json", exclude_defaults=True)


#: Key of the PostgreSQL advisory lock that serialises registry writes.
REGISTRY_LOCK_KEY = 0x6261746F6E


def lock_registry(session: Session) -> None:
    """Serialise registry writes for the rest of the transaction.

    Publish validates against other agents and retire/delete check who depends
    on an agent, so two writers must never interleave (a publish racing a retire
    could otherwise leave a live revision pointing at a retired agent). On
    PostgreSQL: a transaction-scoped advisory lock. On SQLite: taking the write
    lock first (a no-op UPDATE) before anything is read.
    """
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": REGISTRY_LOCK_KEY})
    elif dialect == "sqlite":
        session.execute(text("UPDATE agents SET id = id WHERE 0"))


def _flush(session: Session, what: str) -> None:
    try:
        session.flush()
    except IntegrityError as exc:
        msg = f"{what} conflicted with a concurrent change; retry"
        raise ConcurrentModification(msg) from exc


def get_agent(session: Session, *, slug: str, for_update: bool = False) -> Agent:
    """The identity row for ``slug``. Raises AgentNotFound."""
    stmt = select(Agent).where(Agent.slug == slug)
    if for_update:
        stmt = stmt.with_for_update()
    agent = session.exec(stmt).first()
    if agent is None:
        raise AgentNotFound(f"no agent '{slug}'")
    return agent


def _id(agent: Agent) -> int:
    assert agent.id is not None  # rows read from or flushed to the DB always have one
    return agent.id


def _draft(session: Session, agent: Agent) -> AgentDraft:
    draft = session.get(AgentDraft, _id(agent))
    if draft is None:  # an identity always has a draft; heal rather than fail
        draft = AgentDraft(agent_id=_id(agent), spec={})
        session.add(draft)
    return draft


def _live_version(session: Session, agent: Agent) -> int | None:
    pointer = session.get(AgentLivePointer, _id(agent))
    return pointer.version if pointer else None


def _revision(session: Session, agent: Agent, version: int) -> AgentRevision:
    rev = session.exec(
        select(AgentRevision).where(
            AgentRevision.agent_id == _id(agent), AgentRevision.version == version
        )
    ).first()
    if rev is None:
        raise RevisionNotFound(f"agent '{agent.slug}' has no revision {version}")
    return rev


def to_public(session: Session, agent: Agent) -> AgentPublic:
    """The API view of ``agent``, with where its live revision's bases stand
    (:func:`base_pins`)."""
    live = _live_version(session, agent)
    bases = base_pins(session, agent=agent, version=live) if live is not None else []
    return AgentPublic(
        slug=agent.slug,
        name=agent.name,
        description=agent.description,
        live_version=live,
        draft=AgentSpec.model_validate(_draft(session, agent).spec),
        retired=agent.retired,
        bases=bases,
        base_update_available=any(b.live != b.pinned for b in bases),
        created_at=agent.created_at,
        updated_at=agent.updated_at,
    )


def revision_public(agent: Agent, rev: AgentRevision) -> RevisionPublic:
    """The API view of a revision."""
    return RevisionPublic(
        slug=agent.slug,
        version=rev.version,
        digest=rev.digest,
        spec=AgentSpec.model_validate(rev.spec),
        extends_pins=rev.extends_pins,
        eval_id=rev.eval_id,
        published_at=rev.published_at,
        published_by=rev.published_by,
    )


def _pins_of(chain: list[LoadedRevision]) -> list[str]:
    """The bases of a resolved chain (derived first) as pins: what a publish records."""
    return [base.pin for base in chain[1:]]


def base_pins(session: Session, *, agent: Agent, version: int) -> list[BasePin]:
    """Where the bases of revision ``version`` of ``agent`` stand: one :class:`BasePin`
    per link of its pinned ``extends`` chain, nearest first, ``pinned`` = the version it
    resolves, ``live`` = the version :func:`rebase` would pin now (None when a rebased
    chain would no longer contain that agent, or no longer resolves). A view: it never
    fails on the chain itself. Raises RevisionNotFound."""
    rev = _loaded(agent, _revision(session, agent, version))
    if not rev.extends_pins:
        return []
    try:
        rebased = Resolver(db_lookup(session)).chain(replace(rev, extends_pins=None))
        now = {base.slug: base.version for base in rebased[1:]}
    except BatonError:
        now = {}
    pinned = [parse_ref(pin) for pin in rev.extends_pins]
    return [BasePin(agent=slug, pinned=v or 0, live=now.get(slug)) for slug, v in pinned]


def references(spec: AgentSpec, prefix: str = "") -> list[auth.Reference]:
    """The agents ``spec`` names, each with the role a user needs on it (auth mode).

    ``extends`` needs :data:`baton.grants.auth.EXTENDS_ROLE` (viewer), every subagent
    node's ``agent``, at any depth, :data:`baton.grants.auth.SUBAGENT_ROLE` (user); paths
    are under ``prefix`` (``spec.`` for a create body).
    """
    refs = []
    if spec.extends:
        slug = parse_ref(spec.extends)[0]
        refs.append(auth.Reference(slug, f"{prefix}extends", auth.EXTENDS_ROLE))
    for node, path, _level in iter_tree(with_paths(spec.subagents, f"{prefix}subagents")):
        refs.append(auth.Reference(parse_ref(node.agent)[0], f"{path}.agent", auth.SUBAGENT_ROLE))
    return refs


def _require_spec_references(
    session: Session, user: str | None, slug: str, spec: AgentSpec, prefix: str = ""
) -> None:
    """Auth mode: the user holds the role each reference of ``spec`` (agent ``slug``'s) needs.

    A reference to ``slug`` itself is the writer's own agent (being created, or
    owned: only owners write specs) and is left to the resolver (a cycle is 400).
    """
    if user is not None:
        refs = [r for r in references(spec, prefix) if r.agent != slug]
        auth.require_references(session, user_id=user, references=refs)


def _has_history(session: Session, slug: str) -> bool:
    found = session.exec(select(SessionRow.id).where(SessionRow.agent_slug == slug)).first()
    return found is not None


def slug_taken(session: Session, *, slug: str, auth: bool) -> str | None:
    """Why ``slug`` cannot be created now, or None when it is free.

    Taken: an agent has it; or, in auth mode, sessions of a deleted agent still
    carry it (a step's transcript row included). Whoever created the slug again
    would become the owner of that history: its sessions, transcripts, reviews
    and audit rows (the ACL of Gamut X-Agent Policies, 'Auth mode
    considerations', follows the slug). With auth off there is one user, who
    already sees that history, so only an existing agent takes a slug. Every
    creation path (the API, the ``create_agent`` tool) asks this one function.
    """
    if session.exec(select(Agent.id).where(Agent.slug == slug)).first() is not None:
        return f"agent '{slug}' already exists"
    if auth and _has_history(session, slug):
        return f"'{slug}' has session history from a deleted agent; choose another slug"
    return None


def free_slug(session: Session, *, base: str, auth: bool) -> str:
    """``base``, else ``base-2``, ``base-3``… : the first slug :func:`slug_taken` does not refuse.

    Takes the registry lock first, so the slug stays free until this transaction
    creates it. ``base`` must leave room for the suffix (the ``create_agent``
    tool cuts names to 56 characters).
    """
    lock_registry(session)
    slug, n = base, 2
    while slug_taken(session, slug=slug, auth=auth) is not None:
        slug, n = f"{base}-{n}", n + 1
    return slug


def create_agent(
    session: Session,
    *,
    slug: str,
    name: str,
    description: str = "",
    spec: AgentSpec | None = None,
    user: str | None = None,
) -> Agent:
    """Create an identity and its draft (the one creation path: API, tool, ``baton apply``).

    ``user`` is the acting user in auth mode, None with auth off or for the
    admin ``baton apply``: with a user, a slug with leftover session history is
    refused (:func:`slug_taken`) and the spec's references need their roles
    (:func:`references`: viewer for ``extends``, user for a subagent). Granting
    roles on the new agent is the caller's (the API makes the user owner, the
    tool copies the caller's ACL).
    Raises AgentExists, Forbidden, or a tree-shape InvalidSpec.
    """
    lock_registry(session)
    spec = spec or AgentSpec()
    check_tree_shape(with_paths(spec.subagents, "spec.subagents"))
    taken = slug_taken(session, slug=slug, auth=user is not None)
    if taken is not None:
        raise AgentExists(taken)
    _require_spec_references(session, user, slug, spec, "spec.")
    agent = Agent(slug=slug, name=name, description=description)
    session.add(agent)
    _flush(session, f"creating '{slug}'")
    session.add(AgentDraft(agent_id=_id(agent), spec=_dump(spec)))
    _flush(session, f"creating '{slug}'")
    return agent


def list_agents(
    session: Session, *, limit: int = 50, offset: int = 0, only: list[str] | None = None
) -> tuple[list[Agent], int]:
    """Agents ordered by slug, and the total count; ``only`` limits to those slugs (ACL)."""
    where = [col(Agent.slug).in_(only)] if only is not None else []
    return page(session, Agent, where=where, order_by=[col(Agent.slug)], limit=limit, offset=offset)


def update_agent(
    session: Session, *, slug: str, name: str | None = None, description: str | None = None
) -> Agent:
    """Edit identity metadata (not versioned). Raises AgentNotFound."""
    lock_registry(session)
    agent = get_agent(session, slug=slug, for_update=True)
    if (name is None or name == agent.name) and (
        description is None or description == agent.description
    ):
        return agent
    if name is not None:
        agent.name = name
    if description is not None:
        agent.description = description
    agent.updated_at = utcnow()
    session.add(agent)
    _flush(session, f"updating '{slug}'")
    return agent


def save_draft(session: Session, *, slug: str, spec: AgentSpec, user: str | None = None) -> Agent:
    """Replace the draft. Tree-shape bounds are checked now, references at publish.

    With ``user`` (auth mode), the spec's own references need their roles now
    (:func:`references`); whether they resolve is still checked at publish.
    Raises AgentNotFound, Forbidden, TreeTooDeep, TreeTooLarge, DuplicateAlias.
    """
    lock_registry(session)
    agent = get_agent(session, slug=slug, for_update=True)
    _require_spec_references(session, user, slug, spec)
    check_tree_shape(with_paths(spec.subagents))
    draft = _draft(session, agent)
    if draft.spec == _dump(spec):
        return agent
    draft.spec = _dump(spec)
    draft.updated_at = agent.updated_at = utcnow()
    session.add_all([draft, agent])
    _flush(session, f"saving the draft of '{slug}'")
    return agent


def _loaded(agent: Agent, rev: AgentRevision) -> LoadedRevision:
    return LoadedRevision(
        slug=agent.slug,
        version=rev.version,
        digest=rev.digest,
        spec=AgentSpec.model_validate(rev.spec),
        name=agent.name,
        description=agent.description,
        extends_pins=tuple(rev.extends_pins) if rev.extends_pins is not None else None,
    )


def resolve_ref(session: Session, *, ref: str) -> tuple[Agent, AgentRevision]:
    """Resolve ``slug`` (live revision) or ``slug@v`` (that revision) for a launch.

    Raises InvalidReference, AgentNotFound, AgentRetired, AgentNotPublished,
    RevisionNotFound (Xema Agent Concepts, 'Agent references').
    """
    try:
        slug, version = parse_ref(ref)
    except ValueError as exc:
        raise InvalidReference(str(exc)) from exc
    agent = get_agent(session, slug=slug)
    if agent.retired:
        raise AgentRetired(f"agent '{slug}' is retired; publish or roll back to use it again")
    if version is None:
        version = _live_version(session, agent)
        if version is None:
            raise AgentNotPublished(f"agent '{slug}' has no published revision")
    return agent, _revision(session, agent, version)


def db_lookup(session: Session) -> Lookup:
    """A resolver lookup reading live pointers and revisions from ``session``."""

    def _lookup(ref: str) -> LoadedRevision:
        return _loaded(*resolve_ref(session, ref=ref))

    return _lookup


def resolve_agent(session: Session, *, ref: str, user: str | None = None) -> ResolvedAgent:
    """The effective configuration of ``ref`` (see :mod:`baton.agents.layers`).

    With ``user`` (auth mode) the view is refused (Forbidden, 403) unless the
    user holds viewer on every agent whose content it folds in
    (:func:`shown_references`): refused rather than redacted, because the folded
    fields (prompt, playbook, tools, skills, limits) mix every layer and cannot
    be split without telling what the hidden layer holds.
    """
    agent, rev = resolve_ref(session, ref=ref)
    lookup = db_lookup(session)
    resolver = Resolver(lookup)
    resolved = resolver.resolve(_loaded(agent, rev))
    if user is not None:
        shown = shown_references(resolved, lambda pin: resolver.chain(lookup(pin)))
        auth.require_references(session, user_id=user, references=shown)
    return resolved


def resolve_draft(session: Session, *, slug: str) -> ResolvedAgent:
    """The effective configuration of ``slug``'s mutable draft (version 0, pin
    ``slug@draft``), its bases followed through their live pointers, as :func:`publish`
    would validate it. Only the authoring sandbox runs it (docs/change-safely.md, Fork a
    session): runtime resolution never does. Raises AgentNotFound and the resolver's
    InvalidSpec errors for a draft that does not resolve."""
    agent = get_agent(session, slug=slug)
    spec = AgentSpec.model_validate(_draft(session, agent).spec)
    candidate = LoadedRevision(
        slug=agent.slug,
        version=None,
        digest=spec_digest(spec),
        spec=spec,
        name=agent.name,
        description=agent.description,
    )
    return Resolver(_as_live_lookup(session, agent, candidate)).resolve(candidate)


def is_ambassador(session: Session, *, slug: str, live: ResolvedAgent | None = None) -> bool:
    """Whether the live revision of ``slug`` resolves to ``kind: ambassador``;
    False for an agent that does not resolve (its own refusal applies then). ``live``:
    that resolution, when the caller has just made it (it is not made again)."""
    try:
        return (live or resolve_agent(session, ref=slug)).kind == "ambassador"
    except BatonError:
        return False


def shown_references(
    resolved: ResolvedAgent, chain_of: Callable[[str], list[LoadedRevision]]
) -> list[auth.Reference]:
    """Every agent whose content ``resolved`` shows, as viewer references with their paths.

    The agent's ``extends`` chain (``inheritance[i]``), and for each subagent node
    at any depth its agent and that agent's own chain (both at the node's
    ``….agent`` path: its ``system_prompt`` folds them in). ``chain_of(pin)``
    returns a revision and its bases, derived first (:meth:`Resolver.chain`).
    """
    refs = [
        auth.Reference(parse_ref(pin)[0], f"inheritance[{i}]", "viewer")
        for i, pin in enumerate(resolved.inheritance)
        if i > 0
    ]

    def walk(nodes: list[ResolvedNode], prefix: str) -> None:
        for i, node in enumerate(nodes):
            path = f"{prefix}subagents[{i}]"
            for rev in chain_of(f"{node.agent}@{node.version}"):
                refs.append(auth.Reference(rev.slug, f"{path}.agent", "viewer"))
            walk(node.subagents, f"{path}.")

    walk(resolved.subagents, "")
    return refs


def _as_live_lookup(session: Session, agent: Agent, candidate: LoadedRevision) -> Lookup:
    """Resolve references as they will be once ``candidate`` is live.

    The candidate's bare slug resolves to the candidate (so ``a extends a`` and
    longer cycles through the live pointer are caught) and its own pinned
    revisions resolve even while the agent is retired (it is coming back).
    """
    lookup = db_lookup(session)

    def _lookup(ref: str) -> LoadedRevision:
        slug, version = parse_ref(ref)
        if slug != candidate.slug:
            return lookup(ref)
        if version is None or version == candidate.version:
            return candidate
        return _loaded(agent, _revision(session, agent, version))

    return _lookup


def _live_graph(session: Session) -> dict[str, tuple[Agent, AgentRevision, set[str]]]:
    """Every live revision and the slugs it references, keyed by slug."""
    rows = session.exec(
        select(Agent, AgentRevision)
        .join(AgentLivePointer, col(AgentLivePointer.agent_id) == col(Agent.id))
        .join(
            AgentRevision,
            (col(AgentRevision.agent_id) == col(Agent.id))
            & (col(AgentRevision.version) == col(AgentLivePointer.version)),
        )
    ).all()
    return {
        agent.slug: (
            agent,
            rev,
            {parse_ref(r)[0] for r in _named(rev)},
        )
        for agent, rev in rows
    }


def _validate_as_live(
    session: Session, agent: Agent, candidate: LoadedRevision, user: str | None
) -> list[str]:
    """Validate ``candidate`` and every live agent that depends on it, transitively;
    returns the candidate's ``extends`` chain as pins (what a publish records).

    Derived agents resolve through their pinned bases, so a base's change reaches
    them only when they are rebased (validated then); the check still covers every
    reference that follows a live pointer (a subagent's bare slug). Raises the
    InvalidSpec of the first failure; for a dependent, naming it in ``dependent``.

    With ``user`` (auth mode), before anything resolves, the candidate's own
    references need their roles (so a hidden agent answers 403 like a missing
    one, not 400 ``unknown_agent``); once its chain resolves, so do the
    references of every base in it: each base needs viewer (its content is
    folded in), each inherited subagent node user (the tree runs it), with
    paths like ``base@2:subagents[0].agent``. Raises Forbidden.
    """
    _require_spec_references(session, user, candidate.slug, candidate.spec)
    check_tree_shape(with_paths(candidate.spec.subagents))
    resolver = Resolver(_as_live_lookup(session, agent, candidate))
    resolver.resolve(candidate)
    pins = _pins_of(resolver.chain(candidate))
    if user is not None:
        inherited = [
            ref
            for base in resolver.chain(candidate)[1:]
            for ref in references(base.spec, f"{base.pin}:")
        ]
        auth.require_references(session, user_id=user, references=inherited)
    graph = _live_graph(session)
    affected: list[str] = []
    frontier = {candidate.slug}
    while frontier:
        nxt = {
            slug
            for slug, (_a, _r, refs) in graph.items()
            if refs & frontier and slug != candidate.slug and slug not in affected
        }
        affected.extend(sorted(nxt))
        frontier = nxt
    for slug in affected:
        dep_agent, dep_rev, _refs = graph[slug]
        pin = f"{slug}@{dep_rev.version}"
        try:
            resolver.resolve(_loaded(dep_agent, dep_rev))
        except InvalidSpec as exc:
            msg = f"this change would break live agent {pin}: {exc.detail}"
            raise type(exc)(msg, path=exc.path, dependent=pin) from exc
    return pins


def _set_live(session: Session, agent: Agent, version: int) -> None:
    pointer = session.get(AgentLivePointer, _id(agent))
    if pointer is None:
        pointer = AgentLivePointer(agent_id=_id(agent), version=version)
    pointer.version = version
    pointer.updated_at = agent.updated_at = utcnow()
    agent.retired = False
    session.add_all([pointer, agent])


def publish(
    session: Session,
    *,
    slug: str,
    user: str | None = None,
    eval_id: str | None = None,
    default_gate: PublishGate | None = None,
    published_by: str | None = None,
) -> tuple[AgentRevision, bool]:
    """Publish the draft: validate, pass the publish gate, store revision N+1 with its
    pinned bases and the eval it passed, move the live pointer.

    The draft follows the bases' live revisions (it is the authoring sandbox); the
    revision records the ``extends`` chain it resolved as ``extends_pins``, and resolves
    through those pins from then on (Xema Agent Concepts, 'Agent references'). Returns
    ``(revision, created)``; ``created`` is False when the draft is identical (same
    digest) to the live revision and resolves to the same bases, and nothing is
    written. Publishing a retired agent brings it back. With ``user`` (auth mode) the
    references are ACL-checked (see :func:`_validate_as_live`). ``published_by`` (the
    caller's user, ``local`` with auth off) is recorded on the new revision.

    The publish gate (docs/change-safely.md, 'The publish gate'; :func:`gate_in_force`,
    ``default_gate`` being ``BATON_PUBLISH_GATE``) needs an eval of this draft that
    meets it: ``eval_id``, else the newest completed one
    (:func:`baton.evals.gate.passing_eval`); the new revision records its id. Raises
    AgentNotFound, Forbidden, any InvalidSpec (400) from
    :func:`baton.agents.layers.Resolver.resolve`, EvalNotFound (404), EvalRequired or
    EvalFailed (409).
    """
    lock_registry(session)
    agent = get_agent(session, slug=slug, for_update=True)
    spec = AgentSpec.model_validate(_draft(session, agent).spec)
    return _publish_spec(
        session, agent, spec, user, gate=_GateCall(eval_id, default_gate), by=published_by
    )


def rebase(
    session: Session, *, slug: str, user: str | None = None, published_by: str | None = None
) -> tuple[AgentRevision, bool]:
    """Publish the live revision's spec again, pinned to its bases' live revisions now.

    The explicit way to follow a newer base (a published revision never does by itself):
    the same path, validation and ACL as :func:`publish`, so a user who lost viewer on
    a base can no longer take in its new content (403 ``forbidden``). The draft is not
    read or changed. Returns ``(revision, created)``; ``created`` is False (nothing
    written) when the bases' live revisions are the pinned ones. Raises AgentNotFound,
    AgentRetired, AgentNotPublished, Forbidden, InvalidSpec. ``published_by`` is recorded
    on the new revision, as for :func:`publish`.
    """
    lock_registry(session)
    agent = get_agent(session, slug=slug, for_update=True)
    live = _live_version(session, agent)
    if live is None:
        if agent.retired:
            raise AgentRetired(f"agent '{slug}' is retired; publish or roll back to use it again")
        raise AgentNotPublished(f"agent '{slug}' has no published revision to rebase")
    spec = AgentSpec.model_validate(_revision(session, agent, live).spec)
    return _publish_spec(session, agent, spec, user, gate=None, by=published_by)


@dataclass(frozen=True)
class _GateCall:
    """What a draft publish brings to the gate: the eval named, the deployment's gate."""

    eval_id: str | None
    default: PublishGate | None


def _nearest_gate(chain: list[LoadedRevision]) -> PublishGate | None:
    """The ``publish_gate`` of the nearest layer of ``chain`` (derived first) that sets one."""
    return next((r.spec.publish_gate for r in chain if r.spec.publish_gate), None)


def gate_in_force(
    session: Session, agent: Agent, candidate: LoadedRevision, default: PublishGate | None
) -> PublishGate | None:
    """The publish gate the draft ``candidate`` of ``agent`` must pass (docs/change-safely.md,
    'The publish gate'); None = publishing is not gated.

    Each of the latest published revision and the draft has a gate: its own
    ``publish_gate``, else the nearest base's in its ``extends`` chain (the revision's
    pins; the draft's bases through their live pointers), else ``default``
    (``BATON_PUBLISH_GATE``). Both apply (:meth:`PublishGate.stricter`): a draft can
    tighten its gate at once but loosen or drop it only by passing the one in force. The
    first publish is never gated: before it no session of the agent exists to replay."""
    latest = session.exec(
        select(AgentRevision)
        .where(AgentRevision.agent_id == _id(agent))
        .order_by(col(AgentRevision.version).desc())
        .limit(1)
    ).first()
    if latest is None:
        return None
    published = _nearest_gate(Resolver(db_lookup(session)).chain(_loaded(agent, latest))) or default
    drafted = (
        _nearest_gate(Resolver(_as_live_lookup(session, agent, candidate)).chain(candidate))
        or default
    )
    if published is None or drafted is None:
        return published or drafted
    return published.stricter(drafted)


def _publish_spec(
    session: Session,
    agent: Agent,
    spec: AgentSpec,
    user: str | None,
    *,
    gate: _GateCall | None,
    by: str | None,
) -> tuple[AgentRevision, bool]:
    """Publish ``spec`` as ``agent``'s next revision (the registry lock is held): the one
    path of :func:`publish` and :func:`rebase`. ``gate`` None: not a draft (a rebase
    republishes a spec that was published already), so no publish gate applies. ``by``:
    who publishes (recorded on the revision)."""
    digest = spec_digest(spec)
    candidate = LoadedRevision(
        slug=agent.slug,
        version=None,
        digest=digest,
        spec=spec,
        name=agent.name,
        description=agent.description,
    )
    live = _live_version(session, agent)
    if live is not None:
        current = _revision(session, agent, live)
        if current.digest == digest and current.extends_pins == _chain_pins(
            session, agent, candidate
        ):
            return current, False
    pins = _validate_as_live(session, agent, candidate, user)
    passed = None
    if gate is not None:
        in_force = gate_in_force(session, agent, candidate, gate.default)
        if in_force is not None:
            passed = evals_gate.passing_eval(
                session,
                slug=agent.slug,
                digest=digest,
                gate=in_force,
                eval_id=gate.eval_id,
                user=user,
            ).id
    latest = session.exec(
        select(func.max(AgentRevision.version)).where(AgentRevision.agent_id == _id(agent))
    ).one()
    rev = AgentRevision(
        agent_id=_id(agent),
        version=int(latest or 0) + 1,
        digest=digest,
        spec=_dump(spec),
        extends_pins=pins,
        eval_id=passed,
        published_by=by,
    )
    session.add(rev)
    _set_live(session, agent, rev.version)
    _flush(session, f"publishing '{agent.slug}'")
    return rev, True


def _chain_pins(session: Session, agent: Agent, candidate: LoadedRevision) -> list[str] | None:
    """The bases ``candidate`` would be pinned to now, or None when its chain does not
    resolve (the full validation then says why)."""
    try:
        return _pins_of(Resolver(_as_live_lookup(session, agent, candidate)).chain(candidate))
    except BatonError:
        return None


def list_revisions(session: Session, *, slug: str) -> list[AgentRevision]:
    """All revisions of ``slug``, newest first. Raises AgentNotFound."""
    agent = get_agent(session, slug=slug)
    rows = session.exec(
        select(AgentRevision)
        .where(AgentRevision.agent_id == _id(agent))
        .order_by(col(AgentRevision.version).desc())
    ).all()
    return list(rows)


def get_revision(session: Session, *, slug: str, version: int) -> AgentRevision:
    """Revision ``version`` of ``slug``. Raises AgentNotFound, RevisionNotFound."""
    return _revision(session, get_agent(session, slug=slug), version)


def restore(session: Session, *, slug: str, version: int, user: str | None = None) -> Agent:
    """Copy revision ``version`` into the draft; the live pointer does not move.

    A draft save: with ``user`` (auth mode) the revision's references need their
    roles, as for :func:`save_draft`. Raises AgentNotFound, RevisionNotFound, Forbidden.
    """
    lock_registry(session)
    agent = get_agent(session, slug=slug, for_update=True)
    rev = _revision(session, agent, version)
    _require_spec_references(session, user, slug, AgentSpec.model_validate(rev.spec))
    draft = _draft(session, agent)
    draft.spec = dict(rev.spec)
    draft.updated_at = agent.updated_at = utcnow()
    session.add_all([draft, agent])
    _flush(session, f"restoring '{slug}'")
    return agent


def rollback(session: Session, *, slug: str, version: int, user: str | None = None) -> Agent:
    """Move the live pointer to existing revision ``version``; no new content.

    The revision is validated against today's registry first (a base it extends
    may have changed since it was published), and with ``user`` (auth mode) its
    references are ACL-checked as at publish. Brings a retired agent back.
    Raises AgentNotFound, RevisionNotFound, InvalidSpec, Forbidden.
    """
    lock_registry(session)
    agent = get_agent(session, slug=slug, for_update=True)
    rev = _revision(session, agent, version)
    _validate_as_live(session, agent, _loaded(agent, rev), user)
    _set_live(session, agent, version)
    _flush(session, f"rolling back '{slug}'")
    return agent


def dependents(session: Session, *, slug: str, live_only: bool = True) -> list[str]:
    """Pins of other agents' revisions that reference ``slug`` (extends or subagents).

    ``live_only`` limits the search to live revisions (what retire would break);
    otherwise every revision counts (what a delete, which frees the slug for an
    unrelated agent, would silently repoint).
    """
    stmt = select(Agent, AgentRevision).join(
        AgentRevision, col(AgentRevision.agent_id) == col(Agent.id)
    )
    if live_only:
        stmt = stmt.join(
            AgentLivePointer,
            (col(AgentLivePointer.agent_id) == col(Agent.id))
            & (col(AgentLivePointer.version) == col(AgentRevision.version)),
        )
    rows = session.exec(
        stmt.where(Agent.slug != slug).order_by(col(Agent.slug), col(AgentRevision.version))
    ).all()
    return [
        f"{agent.slug}@{rev.version}"
        for agent, rev in rows
        if any(parse_ref(r)[0] == slug for r in _named(rev))
    ]


def _named(rev: AgentRevision) -> list[str]:
    """Every reference of a revision: its spec's, and its pinned bases (a base further
    down the chain than the spec names, whose retire or delete would break it too)."""
    return [*AgentSpec.model_validate(rev.spec).references(), *(rev.extends_pins or [])]


def teams_using(session: Session, *, slug: str) -> list[str]:
    """Ids of teams that name ``slug`` as a member (here, not in ``teams``: teams import the
    registry, and the registry asks this before it retires or deletes an agent)."""
    rows = session.exec(select(TeamRow)).all()
    return [r.id for r in rows if any(m.get("agent_id") == slug for m in r.members)]


def _refuse_if_used(session: Session, slug: str, action: str, *, live_only: bool) -> None:
    in_teams = teams_using(session, slug=slug)
    if in_teams:
        msg = f"cannot {action} '{slug}': teams name it as a member: {', '.join(in_teams)}"
        raise AgentInUse(msg, dependents=[f"team:{t}" for t in in_teams])
    users = dependents(session, slug=slug, live_only=live_only)
    if users:
        which = "live revisions" if live_only else "revisions"
        msg = f"cannot {action} '{slug}': {which} reference it: {', '.join(users)}"
        raise AgentInUse(msg, dependents=users)


def retire(session: Session, *, slug: str) -> Agent:
    """Clear the live pointer; launches are then refused with ``agent_retired``.

    Raises AgentNotFound, AgentInUse (another live revision references it).
    """
    lock_registry(session)
    agent = get_agent(session, slug=slug, for_update=True)
    _refuse_if_used(session, slug, "retire", live_only=True)
    pointer = session.get(AgentLivePointer, _id(agent))
    if pointer is not None:
        session.delete(pointer)
    agent.retired = True
    agent.updated_at = utcnow()
    session.add(agent)
    _flush(session, f"retiring '{slug}'")
    return agent


def delete_agent(session: Session, *, slug: str) -> None:
    """Delete the identity, draft, revisions and pointer.

    Refused (AgentInUse) while any revision of another agent references the slug
    (a later agent reusing the slug would otherwise change what that pin means),
    while a team names it, and while any of its sessions is open.
    Raises AgentNotFound, AgentInUse.
    """
    lock_registry(session)
    agent = get_agent(session, slug=slug, for_update=True)
    _refuse_if_used(session, slug, "delete", live_only=False)
    open_sessions = session.exec(
        select(func.count())
        .select_from(SessionRow)
        .where(
            SessionRow.agent_slug == slug,
            col(SessionRow.status).not_in(CLOSED_STATUSES),
            col(SessionRow.id).startswith("session-"),  # a step's transcript row ends with it
        )
    ).one()
    if open_sessions:
        # An open session (and its pending reviews) would live on under a slug that a new,
        # unrelated agent could take: cancel them first.
        raise AgentInUse(
            f"cannot delete '{slug}': {open_sessions} of its sessions are still open; "
            "cancel them first",
            open_sessions=int(open_sessions),
        )
    agent_id = _id(agent)
    # Gamut X-Agent Policies, 'Policy storage': policy rows naming the agent go with it
    # (and its ACL).
    policies.delete_for_agent(session, slug=slug)
    auth.delete_for_agent(session, slug=slug)
    for model in (AgentLivePointer, AgentDraft, AgentRevision):
        for row in session.exec(select(model).where(model.agent_id == agent_id)).all():
            session.delete(row)
    session.flush()
    session.delete(agent)
    _flush(session, f"deleting '{slug}'")
