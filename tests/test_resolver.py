"""Resolution rules: prompt modes, merge rules, narrowing only (Xema Agent Concepts,
'Inheritance')."""

from __future__ import annotations

from typing import Any

import pytest

from baton.agents.layers import LoadedRevision, Resolver
from baton.agents.spec import AgentSpec, spec_digest
from baton.contracts.values import ResolvedAgent
from baton.errors import AgentNotFound, DuplicateAlias, InheritanceCycle, UnknownAgent


class Catalog:
    """An in-memory lookup: each ``add`` publishes the next version of a slug."""

    def __init__(self) -> None:
        self.revs: dict[str, list[LoadedRevision]] = {}

    def add(self, slug: str, **spec: Any) -> LoadedRevision:
        parsed = AgentSpec.model_validate(spec)
        versions = self.revs.setdefault(slug, [])
        rev = LoadedRevision(slug, len(versions) + 1, spec_digest(parsed), parsed)
        versions.append(rev)
        return rev

    def __call__(self, ref: str) -> LoadedRevision:
        slug, _, version = ref.partition("@")
        if slug not in self.revs:
            raise AgentNotFound(f"no agent '{slug}'")
        return self.revs[slug][int(version) - 1 if version else -1]

    def resolve(self, slug: str) -> ResolvedAgent:
        return Resolver(self).resolve(self(slug))


@pytest.fixture
def cat() -> Catalog:
    return Catalog()


def test_append_puts_base_prompt_first(cat: Catalog) -> None:
    """prompt_mode append: base prompt, blank line, derived prompt."""
    cat.add("base", system_prompt="Base rules.")
    cat.add("mid", extends="base", system_prompt="Mid rules.")
    cat.add("top", extends="mid", system_prompt="Top rules.")
    assert cat.resolve("top").system_prompt == "Base rules.\n\nMid rules.\n\nTop rules."
    assert cat.resolve("top").inheritance == ["top@1", "mid@1", "base@1"]


def test_replace_keeps_only_the_derived_prompt(cat: Catalog) -> None:
    """prompt_mode replace: the derived prompt alone."""
    cat.add("base", system_prompt="Base rules.")
    cat.add("top", extends="base", prompt_mode="replace", system_prompt="Only me.")
    assert cat.resolve("top").system_prompt == "Only me."


def test_derived_cannot_broaden_the_allowed_envelope(cat: Catalog) -> None:
    """A derived agent's wider allowed_tools and new tools stay inside the base's envelope."""
    cat.add("base", tools=["search", "read"], allowed_tools=["search"])
    cat.add("top", extends="base", tools=["shell"], allowed_tools=["search", "read", "shell"])
    resolved = cat.resolve("top")
    assert resolved.tools == ["search"]
    assert resolved.allowed_tools == ["search"]


def test_blocked_tools_accumulate_and_win(cat: Catalog) -> None:
    """A tool blocked by a base stays blocked even if the derived agent declares it."""
    cat.add("base", tools=["search"], blocked_tools=["shell"])
    cat.add("top", extends="base", tools=["shell", "read"], blocked_tools=["read"])
    resolved = cat.resolve("top")
    assert resolved.tools == ["search"]
    assert resolved.blocked_tools == ["shell", "read"]


def test_tools_and_skills_are_an_ordered_union(cat: Catalog) -> None:
    """Declared tools and skills: base first, then new ones from the derived agent."""
    cat.add("base", tools=["b", "a"], skills=["style"])
    cat.add("top", extends="base", tools=["a", "c"], skills=["style", "law"])
    resolved = cat.resolve("top")
    assert resolved.tools == ["b", "a", "c"]
    assert resolved.skills == ["style", "law"]


def test_limits_take_the_minimum(cat: Catalog) -> None:
    """An overlay can lower a limit but never raise it; unset bounds nothing."""
    cat.add("base", limits={"token_budget": 1000, "max_spawns": 5})
    cat.add("top", extends="base", limits={"token_budget": 5000, "max_spawns": 2, "max_depth": 1})
    limits = cat.resolve("top").limits
    assert (limits.token_budget, limits.max_spawns, limits.max_depth) == (1000, 2, 1)


def test_scalar_fields_most_derived_wins(cat: Catalog) -> None:
    """model, playbook and delegation settings come from the most derived agent that sets them."""
    cat.add(
        "base",
        model="openai:gpt-4o-mini",
        playbook=[{"reply": "base"}],
        delegation={"available_for_delegation": True, "delegation_hint": "base hint"},
    )
    cat.add("top", extends="base", delegation={"available_for_delegation": False})
    resolved = cat.resolve("top")
    assert resolved.model == "openai:gpt-4o-mini"
    assert resolved.playbook is not None and resolved.playbook[0]["reply"] == "base"
    assert resolved.delegation.available_for_delegation is False
    assert resolved.delegation.delegation_hint == "base hint"


def test_isolated_workspace_wins(cat: Catalog) -> None:
    """workspace_sharing narrows: once isolated, a derived agent cannot make it shareable."""
    cat.add("base", workspace_sharing="isolated")
    cat.add("top", extends="base", workspace_sharing="shareable")
    cat.add("open", workspace_sharing="shareable")
    assert cat.resolve("top").workspace_sharing == "isolated"
    assert cat.resolve("open").workspace_sharing == "shareable"


def test_node_narrows_but_never_adds_tools(cat: Catalog) -> None:
    """A node's allowed_tools narrows the referenced agent; naming a tool it lacks adds nothing."""
    cat.add("worker", tools=["search", "read", "write"])
    cat.add(
        "lead",
        subagents=[{"alias": "w", "agent": "worker", "allowed_tools": ["read", "shell"]}],
    )
    (node,) = cat.resolve("lead").subagents
    assert node.tools == ["read"]


def test_parent_envelope_bounds_the_subtree(cat: Catalog) -> None:
    """A child can use only what every ancestor allows and none blocks."""
    cat.add("worker", tools=["search", "read", "write"])
    cat.add(
        "lead",
        allowed_tools=["search", "read"],
        blocked_tools=["read"],
        subagents=[
            {"alias": "w", "agent": "worker", "subagents": [{"alias": "g", "agent": "worker"}]}
        ],
    )
    (node,) = cat.resolve("lead").subagents
    assert node.tools == ["search"]
    assert node.subagents[0].tools == ["search"]


def test_node_prompt_model_and_pin(cat: Catalog) -> None:
    """A node pins its reference, appends its instructions and may override the model."""
    cat.add("worker", system_prompt="Work.", model="anthropic:claude-x")
    cat.add("worker", system_prompt="Work harder.")
    cat.add(
        "lead",
        subagents=[
            {"alias": "old", "agent": "worker@1", "instructions": "Be brief."},
            {"alias": "new", "agent": "worker", "model": "openai:gpt-4o-mini"},
        ],
    )
    old, new = cat.resolve("lead").subagents
    assert (old.version, old.system_prompt, old.model) == (
        1,
        "Work.\n\nBe brief.",
        "anthropic:claude-x",
    )
    assert (new.version, new.system_prompt, new.model) == (2, "Work harder.", "openai:gpt-4o-mini")


def test_inherited_subagents_come_first_and_share_the_alias_space(cat: Catalog) -> None:
    """Base nodes precede derived nodes; a derived node reusing a base alias is refused."""
    cat.add("worker")
    cat.add("base", subagents=[{"alias": "a", "agent": "worker"}])
    cat.add("top", extends="base", subagents=[{"alias": "b", "agent": "worker"}])
    assert [n.alias for n in cat.resolve("top").subagents] == ["a", "b"]
    cat.add("clash", extends="base", subagents=[{"alias": "a", "agent": "worker"}])
    with pytest.raises(DuplicateAlias):
        cat.resolve("clash")


def test_unknown_node_reference_names_its_path(cat: Catalog) -> None:
    """A node whose agent does not exist fails with unknown_agent at that node."""
    cat.add("lead", subagents=[{"alias": "x", "agent": "ghost"}])
    with pytest.raises(UnknownAgent) as info:
        cat.resolve("lead")
    assert info.value.path == "subagents[0].agent"


def test_cycle_through_pins_is_detected(cat: Catalog) -> None:
    """A revisit of the same revision in an extends chain is a cycle."""
    cat.add("a", extends="b")
    with pytest.raises(UnknownAgent):
        cat.resolve("a")
    cat.add("b", extends="a@1")
    with pytest.raises(InheritanceCycle):
        cat.resolve("b")


def test_prompts_are_one_blank_line_apart_whatever_their_trailing_newlines(cat: Catalog) -> None:
    """YAML block prompts ending in newlines still join with exactly one blank line."""
    cat.add("base", system_prompt="Base rules.\n")
    cat.add("top", extends="base", system_prompt="\nTop rules.\n")
    assert cat.resolve("top").system_prompt == "Base rules.\n\nTop rules."
