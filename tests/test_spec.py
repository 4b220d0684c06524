"""The authored spec: schema strictness, removed fields, tree bounds, digests (Xema Agent
Concepts)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from baton.agents.spec import AgentSpec, check_tree_shape, parse_ref, spec_digest, with_paths
from baton.errors import DuplicateAlias, TreeTooDeep, TreeTooLarge


def deep_tree(levels: int) -> list[dict[str, Any]]:
    """A single chain of nodes ``levels`` deep."""
    node: dict[str, Any] = {"alias": f"n{levels}", "agent": "leaf"}
    for level in range(levels - 1, 0, -1):
        node = {"alias": f"n{level}", "agent": "leaf", "subagents": [node]}
    return [node]


def wide_tree(count: int) -> list[dict[str, Any]]:
    """``count`` sibling nodes at level 1."""
    return [{"alias": f"n{i}", "agent": "leaf"} for i in range(count)]


def shape(subagents: list[dict[str, Any]]) -> None:
    check_tree_shape(with_paths(AgentSpec.model_validate({"subagents": subagents}).subagents))


def test_six_levels_is_allowed() -> None:
    """A tree exactly 6 levels deep passes the depth bound."""
    shape(deep_tree(6))


def test_seven_levels_is_refused_at_the_seventh_node() -> None:
    """A 7-level tree raises tree_too_deep with the path of the 7th-level node."""
    with pytest.raises(TreeTooDeep) as info:
        shape(deep_tree(7))
    assert info.value.code == "tree_too_deep"
    assert info.value.path == "subagents[0]" + ".subagents[0]" * 6


def test_sixty_four_nodes_is_allowed() -> None:
    """64 nodes in total passes the size bound."""
    shape(wide_tree(64))


def test_sixty_five_nodes_is_refused() -> None:
    """A 65th node raises tree_too_large pointing at it."""
    with pytest.raises(TreeTooLarge) as info:
        shape(wide_tree(65))
    assert info.value.path == "subagents[64]"


def test_node_count_spans_levels() -> None:
    """Nodes count across levels: 32 parents with a child each is 64; one more fails."""
    tree = [
        {"alias": f"p{i}", "agent": "leaf", "subagents": [{"alias": "c", "agent": "leaf"}]}
        for i in range(32)
    ]
    shape(tree)
    with pytest.raises(TreeTooLarge):
        shape([*tree, {"alias": "extra", "agent": "leaf"}])


def test_duplicate_sibling_alias_is_refused() -> None:
    """Two siblings with one alias raise duplicate_alias at the second one."""
    tree = [
        {"alias": "x", "agent": "leaf", "subagents": [*wide_tree(2), {"alias": "n0", "agent": "a"}]}
    ]
    with pytest.raises(DuplicateAlias) as info:
        shape(tree)
    assert info.value.path == "subagents[0].subagents[2].alias"


def test_same_alias_in_different_branches_is_allowed() -> None:
    """Aliases need only be distinct among siblings, not across the tree."""
    shape(
        [
            {"alias": "a", "agent": "leaf", "subagents": [{"alias": "same", "agent": "leaf"}]},
            {"alias": "b", "agent": "leaf", "subagents": [{"alias": "same", "agent": "leaf"}]},
        ]
    )


@pytest.mark.parametrize(
    "doc",
    [
        {"limits": {"maxFanout": 4}},
        {"limits": {"max_fanout": 4}},
        {"max_fanout": 4},
        {"subagents": [{"alias": "a", "agent": "leaf", "maxFanout": 2}]},
    ],
)
def test_removed_fanout_field_is_refused_as_removed(doc: dict[str, Any]) -> None:
    """maxFanout / max_fanout anywhere in a spec fails with error type removed_field."""
    with pytest.raises(ValidationError) as info:
        AgentSpec.model_validate(doc)
    assert [e["type"] for e in info.value.errors()] == ["removed_field"]


def test_unknown_field_is_an_error() -> None:
    """An unknown field is refused, never silently dropped."""
    with pytest.raises(ValidationError) as info:
        AgentSpec.model_validate({"system_prompt": "x", "temperature": 0.2})
    assert info.value.errors()[0]["type"] == "extra_forbidden"
    assert info.value.errors()[0]["loc"] == ("temperature",)


def test_digest_ignores_key_order_and_explicit_defaults() -> None:
    """The digest is over canonical JSON: key order and spelled-out defaults do not matter."""
    a = AgentSpec.model_validate({"system_prompt": "x", "tools": ["a"]})
    b = AgentSpec.model_validate({"tools": ["a"], "prompt_mode": "append", "system_prompt": "x"})
    assert spec_digest(a) == spec_digest(b)
    assert spec_digest(a).startswith("sha256:") and len(spec_digest(a)) == 71


def test_digest_changes_with_content() -> None:
    """Any content change gives a new digest."""
    a = AgentSpec.model_validate({"system_prompt": "x"})
    b = AgentSpec.model_validate({"system_prompt": "y"})
    assert spec_digest(a) != spec_digest(b)


def test_parse_ref() -> None:
    """`slug` has no version, `slug@3` has version 3, anything else is refused."""
    assert parse_ref("writer") == ("writer", None)
    assert parse_ref("writer@3") == ("writer", 3)
    for bad in ("Writer", "writer@0", "writer@", "@3", "a b"):
        with pytest.raises(ValueError):
            parse_ref(bad)


def test_playbook_rule_needs_an_answer_and_a_valid_pattern() -> None:
    """A playbook rule without reply/tool_calls, or with a broken regex, is refused."""
    with pytest.raises(ValidationError):
        AgentSpec.model_validate({"playbook": [{"when": "x"}]})
    with pytest.raises(ValidationError):
        AgentSpec.model_validate({"playbook": [{"when": "(", "reply": "r"}]})
    spec = AgentSpec.model_validate({"playbook": [{"tool_calls": [{"tool": "list_agents"}]}]})
    assert spec.playbook is not None and spec.playbook[0].tool_calls[0].args == {}


@pytest.mark.parametrize(
    "doc",
    [
        {"system_prompt": "nul\x00here"},
        {"system_prompt": "lone \ud800 surrogate"},
        {"playbook": [{"reply": "r", "tool_calls": [{"tool": "t", "args": {"x": "\ud800"}}]}]},
        {"playbook": [{"reply": "r", "tool_calls": [{"tool": "t", "args": {"x": float("nan")}}]}]},
        {"playbook": [{"when": "a{4294967296}", "reply": "r"}]},
        {"playbook": [{"when": "(" * 1000 + ")" * 1000, "reply": "r"}]},
        {"playbook": [{"when": "((a{1000}){1000}){3}", "reply": "r"}]},
        {"playbook": [{"reply": "r", "tool_calls": [{"tool": "bad\x00name"}]}]},
        {"limits": {"max_spawns": 10**300}},
        {"tools": ["t"] * 257},
    ],
)
def test_unstorable_or_unbounded_values_are_refused(doc: dict[str, Any]) -> None:
    """NUL, lone surrogates, NaN, broken or huge patterns and oversized values fail validation."""
    with pytest.raises(ValidationError):
        AgentSpec.model_validate(doc)


def test_deeply_nested_args_are_refused() -> None:
    """Tool-call args nested deeper than 16 levels are refused; 16 is fine."""

    def nest(levels: int) -> Any:
        value: Any = "leaf"
        for _ in range(levels):
            value = [value]
        return value

    ok = {"playbook": [{"reply": "r", "tool_calls": [{"tool": "t", "args": {"x": nest(15)}}]}]}
    AgentSpec.model_validate(ok)
    bad = {"playbook": [{"reply": "r", "tool_calls": [{"tool": "t", "args": {"x": nest(17)}}]}]}
    with pytest.raises(ValidationError):
        AgentSpec.model_validate(bad)


def test_catastrophic_pattern_times_out_as_no_match() -> None:
    """A backtracking-heavy pattern is bounded in time and counts as not matching."""
    import time

    from baton.agents.spec import pattern_matches

    started = time.process_time()  # CPU time: immune to the machine's other load
    assert pattern_matches("(a+)+$", "a" * 40 + "!") is False
    assert time.process_time() - started < 2
    assert pattern_matches("HELLO", "well hello there") is True
