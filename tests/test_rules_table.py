"""docs/architecture.md's "Where each rule lives" table names only code and tests that exist.

Each row is ``| rule | source | where | tests |``. In ``where``, every code span is a dotted
Python name (a module, then attributes: ``baton.runs.metering.admit_call``, a class's
method or a pydantic model's field), a file of the repository (``docs/gen.py``), or a
``BATON_*`` variable of :class:`baton.settings.Settings`. In ``tests``, every code span is
``tests/<file>.py`` or ``tests/<file>.py::<test>`` (a test function of that file, found by
name without importing it), or a ``make`` target of the Makefile.
"""

from __future__ import annotations

import ast
import importlib
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from baton.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
TABLE_HEADING = "## Where each rule lives"
COLUMNS = ["rule", "source", "where", "tests"]
SPAN = re.compile(r"`([^`]+)`")
DOTTED = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+$")
TEST_REF = re.compile(r"^(tests/[\w/]+\.py)(?:::(\w+))?$")
#: Rules the seeds state that the table must carry (matched in its rule column).
SEED_RULES = [
    "one hop",
    "self-invocation",
    "self-delegation",
    "a team member cannot re-delegate",
    "policy precedence",
    "review timeout",
    "review outcomes",
    "always allow",
    "pinned revisions",
    "live pointer",
    "handoff",
    "idle completion",
    "balance ceiling",
    "token budget",
    "visibility",
]


def table_rows() -> list[list[str]]:
    """The table's body rows, each split into its four cells."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == COLUMNS, header
    # A cell never holds a bare `|`: code spans escape theirs as `\|`.
    rows = [re.split(r"(?<!\\)\|", ln.strip().strip("|")) for ln in lines[2:]]
    for row in rows:
        assert len(row) == len(COLUMNS), row
    return [[c.strip() for c in row] for row in rows]


ROWS = table_rows()


def resolve(name: str) -> Any:
    """``name`` imported: the longest importable module prefix, then getattr for the rest;
    a pydantic model's field resolves to its FieldInfo. Raises LookupError."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            fields = getattr(obj, "model_fields", None)
            if isinstance(obj, type) and fields and attr in fields:
                obj = fields[attr]
            elif hasattr(obj, attr):
                obj = getattr(obj, attr)
            else:
                raise LookupError(f"{name}: no {attr!r} on {obj!r}")
        return obj
    raise LookupError(f"{name}: no module")


@cache
def defined_tests(path: str) -> frozenset[str]:
    """Names of the test functions (module level and in classes) defined in ``path``."""
    tree = ast.parse((ROOT / path).read_text())
    return frozenset(
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    )


def check_where(span: str) -> None:
    if re.fullmatch(r"BATON_[A-Z_]+", span):
        field = span.removeprefix("BATON_").lower()
        assert field in Settings.model_fields, f"{span}: not a setting"
    elif "/" in span or span.endswith((".toml", ".md", ".py")):
        assert (ROOT / span).exists(), f"{span}: no such file"
    else:
        assert DOTTED.match(span), f"{span}: not a dotted name, file or setting"
        resolve(span)


def check_test(span: str) -> None:
    if span.startswith("make "):
        target = span.split()[1]
        assert re.search(rf"^{target}:", (ROOT / "Makefile").read_text(), re.M), span
        return
    found = TEST_REF.match(span)
    assert found, f"{span}: not tests/<file>.py[::<test>]"
    path, name = found.groups()
    assert (ROOT / path).is_file(), f"{path}: no such file"
    if name is not None:
        assert name in defined_tests(path), f"{span}: no such test"


@pytest.mark.parametrize("row", ROWS, ids=[f"row{i:02d}" for i in range(len(ROWS))])
def test_every_function_and_test_a_row_names_exists(row: list[str]) -> None:
    """Each code span of a row's ``where`` cell imports (or is a file or a setting), and
    each of its ``tests`` cell is a test file or a test defined in it."""
    for cell, check in ((row[2], check_where), (row[3], check_test)):
        spans = SPAN.findall(cell)
        assert spans, f"{row[0]}: names no code or no test"
        for span in spans:
            check(span)


def test_the_seeds_rules_each_have_a_row() -> None:
    """Every rule of the seeds Baton implements has a row (matched in the rule column)."""
    rules = " ".join(row[0].lower() for row in ROWS)
    missing = [rule for rule in SEED_RULES if rule not in rules]
    assert missing == []


def test_a_missing_function_or_test_is_caught() -> None:
    """The checks fail for a name that does not exist: the table cannot name a ghost."""
    with pytest.raises(LookupError):
        check_where("baton.runs.metering.no_such_function")
    with pytest.raises(AssertionError):
        check_test("tests/test_rules_table.py::test_no_such_test")
    with pytest.raises(AssertionError):
        check_where("BATON_NO_SUCH_SETTING")
    check_where("baton.contracts.workflow_io.SessionConfig.review_timeout_s")
