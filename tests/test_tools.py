"""Ordinary tools: schema validation and bounded arithmetic."""

from __future__ import annotations

import pytest

from baton.agents.tools import ToolError, run_tool

ALL = ["calculator", "current_time", "word_count"]


def test_calculator_evaluates_arithmetic() -> None:
    """Plain arithmetic with precedence and parentheses."""
    assert run_tool("calculator", {"expression": "(2 + 3) * 4 - 2 ** 3"}, ALL) == "12"


@pytest.mark.parametrize(
    "expression",
    [
        "9**9**9",
        "((10**64)**64)**64",
        "__import__('os')",
        "2 ** -1000000",
        "1/0",
        "x + 1",
        "1j * 2",
    ],
)
def test_calculator_refuses_unsafe_or_huge_expressions(expression: str) -> None:
    """Names, calls, huge powers and division by zero are tool errors, not crashes."""
    with pytest.raises(ToolError):
        run_tool("calculator", {"expression": expression}, ALL)


def test_arguments_are_checked_against_the_schema() -> None:
    """Missing or unknown arguments are refused naming where."""
    with pytest.raises(ToolError, match="invalid arguments for calculator"):
        run_tool("calculator", {"expr": "1"}, ALL)
    with pytest.raises(ToolError, match="timezone"):
        run_tool("current_time", {"timezone": 5}, ALL)


def test_tools_not_offered_are_refused() -> None:
    """A tool the agent may not use, or that does not exist, is a tool error."""
    with pytest.raises(ToolError, match="not available"):
        run_tool("calculator", {"expression": "1"}, ["word_count"])
    with pytest.raises(ToolError, match="not available"):
        run_tool("shell", {}, ["shell"])


def test_unknown_timezone_and_word_count() -> None:
    """current_time refuses unknown zones; word_count counts words."""
    with pytest.raises(ToolError, match="unknown timezone"):
        run_tool("current_time", {"timezone": "Mars/Olympus"}, ALL)
    assert run_tool("word_count", {"text": "one two  three"}, ALL) == "3"
