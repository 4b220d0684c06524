"""What a turn no longer pays for: a provider model built per call, and a
workflow module searched for and compiled per new run."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from baton.providers.models import build_model
from worker.factory import WorkflowCodeCache, _CompiledOnceLoader


async def test_a_provider_model_is_built_once_per_loop_and_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two calls share one model (one HTTP client and its connections); another base URL
    or key builds a new one; the scripted model is built per call (it is the playbook)."""
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "k1")
    first = build_model("openai-chat:m", playbook=None, agent_slug="a")
    assert build_model("openai-chat:m", playbook=None, agent_slug="a") is first
    assert build_model("openai-chat:other", playbook=None, agent_slug="a") is not first
    monkeypatch.setenv("OPENAI_API_KEY", "k2")
    rekeyed = build_model("openai-chat:m", playbook=None, agent_slug="a")
    assert rekeyed is not first
    playbook = [{"reply": "ok"}]
    assert build_model("scripted", playbook=playbook, agent_slug="a") is not build_model(
        "scripted", playbook=playbook, agent_slug="a"
    )


def _cached_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str
) -> tuple[Path, Callable[[], Any]]:
    """A package ``name`` with a module ``mod`` holding ``source``, its imports served by a
    :class:`WorkflowCodeCache` first on ``sys.meta_path``; (its directory, a function that
    imports ``name.mod`` afresh as the sandbox does for a new run)."""
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", [WorkflowCodeCache([name]), *sys.meta_path])

    def fresh() -> Any:
        for module in (f"{name}.mod", name):
            sys.modules.pop(module, None)
        return importlib.import_module(f"{name}.mod")

    return pkg, fresh


def test_a_cached_workflow_module_is_compiled_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Re-importing a module of a cached package (as the sandbox does per run) reuses its
    code object; an edited file is compiled again; other packages are left alone."""
    pkg, fresh = _cached_package(tmp_path, monkeypatch, "cachedpkg", "def f():\n    return 1\n")
    monkeypatch.setattr(_CompiledOnceLoader, "codes", {})
    one, two = fresh(), fresh()
    assert one is not two
    assert one.f.__code__ is two.f.__code__
    assert isinstance(one.__spec__.loader, _CompiledOnceLoader)
    (pkg / "mod.py").write_text("def f():\n    return 2\n")
    os.utime(pkg / "mod.py", ns=(1, 1))  # a new modification time, whatever the clock
    assert fresh().f() == 2
    assert WorkflowCodeCache(["cachedpkg"]).find_spec("json", None) is None


def test_a_cached_workflow_module_is_searched_for_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a cached package's modules were found, re-importing them (as the sandbox does
    per run) searches sys.path no more, and each import still gets a fresh module from a
    fresh spec: the package with its search path, the module with none."""
    pkg, fresh = _cached_package(tmp_path, monkeypatch, "searchedpkg", "X = []\n")
    one = fresh()
    searched: list[str] = []
    real = importlib.machinery.PathFinder.find_spec

    def counted(name: str, path: object = None, target: object = None) -> object:
        searched.append(name)
        return real(name, path, target)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.machinery.PathFinder, "find_spec", counted)
    two = fresh()
    assert not [n for n in searched if n.startswith("searchedpkg")], searched
    assert one is not two and one.X is not two.X
    assert one.__spec__ is not two.__spec__
    assert two.__spec__.origin == str(pkg / "mod.py")
    assert two.__spec__.submodule_search_locations is None
    assert sys.modules["searchedpkg"].__path__ == [str(pkg)]
