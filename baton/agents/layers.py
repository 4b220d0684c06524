"""The resolver: from one published revision to its effective configuration.

Pure code over a *lookup* (``ref -> LoadedRevision``) so the registry can run it
against the database and publish-time validation against the database plus the
candidate draft. Rules (Xema Agent Concepts, 'Inheritance' and 'What bounds a tree'; the
merge rules are Baton's and are documented in docs/agents.md, 'Resolution rules'):

- ``extends`` is walked derived → base: a published revision's chain is the pins it
  recorded (``LoadedRevision.extends_pins``), a draft's follows the live pointers. A
  revisit is ``inheritance_cycle``; more than ``MAX_INHERITANCE_LINKS`` (32) links is
  ``inheritance_too_deep``.
- Values are folded base → derived: ``prompt_mode`` append joins base and derived
  prompts with a blank line, replace keeps the derived prompt only; model and
  playbook: the most derived value set; skills and tools: ordered union;
  ``allowed_tools``: intersection (null = no envelope); ``blocked_tools``: union;
  limits: the minimum of the values set; ``workspace_sharing``: isolated wins;
  ``kind``: the most derived value set, else ``agent``.
- Narrowing only: a derived agent or a subagent node can never use a tool its
  base or its parent's envelope does not allow, nor one they block.
- Subagents: base nodes then derived nodes, then the tree bounds apply to the
  merged tree and every node's reference must resolve (``unknown_agent``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from baton.agents.spec import (
    MAX_INHERITANCE_LINKS,
    AgentSpec,
    SubagentNode,
    check_tree_shape,
    with_paths,
)
from baton.contracts.values import (
    McpServerRef,
    ResolvedAgent,
    ResolvedDelegation,
    ResolvedLimits,
    ResolvedNode,
)
from baton.errors import BatonError, InheritanceCycle, InheritanceTooDeep, UnknownAgent


@dataclass(frozen=True)
class LoadedRevision:
    """A revision as the resolver sees it. ``version`` is None for an unpublished candidate."""

    slug: str
    version: int | None
    digest: str
    spec: AgentSpec
    name: str = ""
    description: str = ""
    #: The ``extends`` chain this revision was published against, as pins, nearest base
    #: first (``["mid@2", "base@3"]``; ``()`` = extends nothing). None = not pinned: a
    #: candidate draft, or a revision migrated without a resolvable chain; such a chain
    #: follows the live pointers.
    extends_pins: tuple[str, ...] | None = None

    @property
    def key(self) -> tuple[str, int | None]:
        return (self.slug, self.version)

    @property
    def pin(self) -> str:
        return f"{self.slug}@{self.version}" if self.version is not None else f"{self.slug}@draft"


#: Maps an agent reference (``slug`` or ``slug@v``) to a revision; raises a
#: :class:`BatonError` (agent_not_found, revision_not_found, …) when it cannot.
Lookup = Callable[[str], LoadedRevision]


@dataclass
class _Envelope:
    allowed: frozenset[str] | None
    blocked: frozenset[str]


@dataclass
class _Intrinsic:
    """An agent's own layer after folding its ``extends`` chain."""

    prompt: str = ""
    model: str | None = None
    playbook: list[dict[str, object]] | None = None
    skills: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    allowed: frozenset[str] | None = None
    blocked: list[str] = field(default_factory=list)
    limits: ResolvedLimits = field(default_factory=ResolvedLimits)
    available_for_delegation: bool | None = None
    delegation_hint: str | None = None
    workspace_sharing: Literal["isolated", "shareable"] | None = None
    kind: Literal["agent", "ambassador"] | None = None
    nodes: list[tuple[SubagentNode, str]] = field(default_factory=list)
    chain: list[str] = field(default_factory=list)
    #: MCP servers of the chain by name, the derived agent's winning.
    mcp_servers: dict[str, McpServerRef] = field(default_factory=dict)

    def usable_tools(self, envelope: _Envelope) -> list[str]:
        return [
            t
            for t in self.tools
            if (envelope.allowed is None or t in envelope.allowed) and t not in envelope.blocked
        ]


def _union(first: Iterable[str], second: Iterable[str]) -> list[str]:
    return list(dict.fromkeys([*first, *second]))


def _intersect(*sets: frozenset[str] | None) -> frozenset[str] | None:
    out: frozenset[str] | None = None
    for s in sets:
        if s is not None:
            out = s if out is None else out & s
    return out


def _min(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _join(*prompts: str | None) -> str:
    # YAML block scalars end in a newline: strip so parts are one blank line apart.
    return "\n\n".join(p.strip() for p in prompts if p and p.strip())


def _fold(base: _Intrinsic, rev: LoadedRevision, path_prefix: str) -> _Intrinsic:
    spec = rev.spec
    sharing = base.workspace_sharing
    if spec.workspace_sharing == "isolated" or sharing is None:
        sharing = spec.workspace_sharing or sharing
    return _Intrinsic(
        prompt=(
            _join(spec.system_prompt)
            if spec.prompt_mode == "replace"
            else _join(base.prompt, spec.system_prompt)
        ),
        model=spec.model or base.model,
        playbook=(
            [r.model_dump(mode="json") for r in spec.playbook]
            if spec.playbook is not None
            else base.playbook
        ),
        skills=_union(base.skills, spec.skills),
        tools=_union(base.tools, spec.tools),
        mcp_servers={
            **base.mcp_servers,
            **{m.name: McpServerRef.model_validate(m.model_dump()) for m in spec.mcp_servers},
        },
        allowed=_intersect(
            base.allowed,
            frozenset(spec.allowed_tools) if spec.allowed_tools is not None else None,
        ),
        blocked=_union(base.blocked, spec.blocked_tools),
        limits=ResolvedLimits(
            max_depth=_min(base.limits.max_depth, spec.limits.max_depth),
            max_spawns=_min(base.limits.max_spawns, spec.limits.max_spawns),
            token_budget=_min(base.limits.token_budget, spec.limits.token_budget),
        ),
        available_for_delegation=(
            spec.delegation.available_for_delegation
            if spec.delegation.available_for_delegation is not None
            else base.available_for_delegation
        ),
        delegation_hint=spec.delegation.delegation_hint or base.delegation_hint,
        workspace_sharing=sharing,
        kind=spec.kind or base.kind,
        nodes=[*base.nodes, *with_paths(spec.subagents, f"{path_prefix}subagents")],
        chain=[rev.pin, *base.chain],
    )


class Resolver:
    """Resolves revisions through ``lookup``; caches each revision's intrinsic layer.

    One instance serves one resolution (the cache assumes the lookup is stable).
    """

    def __init__(self, lookup: Lookup) -> None:
        self._lookup = lookup
        self._cache: dict[tuple[str, int | None], _Intrinsic] = {}

    def _load(self, ref: str, path: str) -> LoadedRevision:
        try:
            return self._lookup(ref)
        except BatonError as exc:
            raise UnknownAgent(
                f"reference '{ref}' does not resolve: {exc.detail}", path=path
            ) from exc

    def chain(self, rev: LoadedRevision, path: str = "extends") -> list[LoadedRevision]:
        """``rev`` and its bases, derived first. Raises InheritanceCycle / InheritanceTooDeep.

        A published revision's chain is its own ``extends_pins`` (the bases as they were
        when it was published; the bases' own ``extends`` and pins are not read), so a
        base that publishes again changes nothing here (Xema Agent Concepts, 'Agent
        references': compile to immutable pins). A revision without pins (a draft being
        published) walks each ``extends`` through the lookup: bare slugs follow the live
        pointers at every link.
        """
        chain = [rev]
        seen = {rev.key}
        current = rev
        pins = iter(rev.extends_pins) if rev.extends_pins is not None else None
        while True:
            ref = current.spec.extends if pins is None else next(pins, None)
            if not ref:
                break
            base = self._load(ref, path)
            if base.key in seen:
                cycle = " -> ".join([r.pin for r in chain] + [base.pin])
                raise InheritanceCycle(f"extends chain forms a cycle: {cycle}", path=path)
            if len(chain) - 1 >= MAX_INHERITANCE_LINKS:
                raise InheritanceTooDeep(
                    f"extends chain from '{rev.slug}' is longer than {MAX_INHERITANCE_LINKS} links",
                    path=path,
                )
            seen.add(base.key)
            chain.append(base)
            current = base
        return chain

    def intrinsic(self, rev: LoadedRevision, path: str = "extends") -> _Intrinsic:
        """The folded layer of ``rev`` (no subagent resolution)."""
        cached = self._cache.get(rev.key)
        if cached is not None:
            return cached
        chain = self.chain(rev, path)
        layer = _Intrinsic()
        for depth, item in enumerate(reversed(chain)):
            is_root = depth == len(chain) - 1
            layer = _fold(layer, item, "" if is_root else f"{item.pin}:")
        self._cache[rev.key] = layer
        return layer

    def _node(self, node: SubagentNode, path: str, parent: _Envelope) -> ResolvedNode:
        target = self._load(node.agent, f"{path}.agent")
        layer = self.intrinsic(target, f"{path}.agent")
        envelope = _Envelope(
            allowed=_intersect(
                parent.allowed,
                layer.allowed,
                frozenset(node.allowed_tools) if node.allowed_tools is not None else None,
            ),
            blocked=parent.blocked | frozenset(layer.blocked),
        )
        return ResolvedNode(
            alias=node.alias,
            agent=target.slug,
            version=target.version if target.version is not None else 0,
            system_prompt=_join(layer.prompt, node.instructions),
            model=node.model or layer.model,
            tools=layer.usable_tools(envelope),
            allowed_tools=sorted(envelope.allowed) if envelope.allowed is not None else None,
            blocked_tools=sorted(envelope.blocked),
            limits=layer.limits,
            subagents=[
                self._node(child, f"{path}.subagents[{i}]", envelope)
                for i, child in enumerate(node.subagents)
            ],
        )

    def resolve(self, rev: LoadedRevision) -> ResolvedAgent:
        """The effective configuration of ``rev``.

        Raises InheritanceCycle, InheritanceTooDeep, UnknownAgent, TreeTooDeep,
        TreeTooLarge or DuplicateAlias (all 400 ``InvalidSpec``) with a path.
        """
        layer = self.intrinsic(rev)
        check_tree_shape(layer.nodes)
        envelope = _Envelope(allowed=layer.allowed, blocked=frozenset(layer.blocked))
        return ResolvedAgent(
            slug=rev.slug,
            version=rev.version if rev.version is not None else 0,
            digest=rev.digest,
            name=rev.name,
            description=rev.description,
            system_prompt=layer.prompt,
            model=layer.model,
            playbook=layer.playbook,
            skills=layer.skills,
            tools=layer.usable_tools(envelope),
            allowed_tools=sorted(layer.allowed) if layer.allowed is not None else None,
            blocked_tools=layer.blocked,
            limits=layer.limits,
            delegation=ResolvedDelegation(
                available_for_delegation=bool(layer.available_for_delegation),
                delegation_hint=layer.delegation_hint,
            ),
            workspace_sharing=layer.workspace_sharing or "isolated",
            kind=layer.kind or "agent",
            subagents=[self._node(node, path, envelope) for node, path in layer.nodes],
            inheritance=layer.chain,
            mcp_servers=list(layer.mcp_servers.values()),
        )
