"""The contracts package and the guard import cleanly in any order: each module, imported
first in a fresh interpreter, loads (no import circle at run time), and each public name
has one home."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from types import ModuleType

import pytest

MODULES = [
    "baton.contracts",
    "baton.contracts.activity_io",
    "baton.contracts.codes",
    "baton.contracts.evals",
    "baton.contracts.search",
    "baton.contracts.text",
    "baton.contracts.tool_args",
    "baton.contracts.values",
    "baton.contracts.workflow_io",
    "baton.contracts.workspaces",
    "baton.permissions.guard",
    "baton.permissions.gate",
]


@pytest.mark.parametrize("module", MODULES)
def test_a_module_imported_first_loads(module: str) -> None:
    """``import <module>`` as the first import of a fresh interpreter succeeds."""
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def defined_names(module: ModuleType) -> set[str]:
    """The public names ``module``'s own source assigns at its top level."""
    names: set[str] = set()
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


def test_each_public_name_is_defined_in_one_module_only() -> None:
    """No public name is defined by two contracts modules (or by one and the guard): an
    import names the one home of what it takes."""
    homes: dict[str, list[str]] = {}
    for module in MODULES[1:-1]:
        for name in defined_names(importlib.import_module(module)):
            homes.setdefault(name, []).append(module)
    assert homes
    twice = {n: m for n, m in homes.items() if len(m) > 1}
    assert not twice, twice


def test_the_package_re_exports_nothing() -> None:
    """``baton.contracts`` itself holds no public name (its submodules aside): a caller
    imports the module."""
    import baton.contracts

    names = [
        n
        for n, v in vars(baton.contracts).items()
        if not n.startswith("_") and not isinstance(v, ModuleType)
    ]
    assert names == []
