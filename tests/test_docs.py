"""The docs cannot drift: the generated pages match the code, and the site builds clean.

``docs/gen.py`` writes three blocks from the code (the settings table, the CLI
reference, the API reference); these tests fail when a checked-in page is stale
(run ``python -m docs.gen``, or ``make docs``) and when ``mkdocs build --strict``
warns (a broken link or anchor, a page missing from the nav).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from baton.settings import Settings
from docs import gen

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("block", gen.BLOCKS, ids=[b.name for b in gen.BLOCKS])
def test_generated_blocks_are_current(block: gen.Block) -> None:
    """Each generated block as checked in equals what docs/gen.py makes from the code."""
    assert block.current() == block.wanted(), f"stale {block.page}: run `python -m docs.gen`"


def test_every_setting_is_on_the_configuration_page() -> None:
    """Every Settings field's BATON_* variable has a row with a meaning on the page."""
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    for name, field in Settings.model_fields.items():
        assert field.description, f"Settings.{name} has no description for the docs"
        assert f"| `BATON_{name.upper()}` |" in page, name


def test_every_command_is_in_the_cli_reference() -> None:
    """Every command path users type (``baton db upgrade``, …) has its own section."""
    page = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    commands = gen.cli_commands()
    assert {"baton", "baton db upgrade", "baton step run", "baton reviews approve"} <= set(commands)
    for path in commands:
        assert f"# `{path}`\n" in page, path


def test_every_api_operation_is_in_the_api_reference() -> None:
    """Every method and path of the OpenAPI document has its own section."""
    page = (ROOT / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    operations = gen.api_operations()
    assert "POST /v1/sessions" in operations and "GET /v1/reviews/{review_id}" in operations
    for op in operations:
        assert f"### `{op}`\n" in page, op


def test_the_deployment_page_names_every_workflows_versioning_behaviour() -> None:
    """Every workflow type of ``VERSIONING_BEHAVIOR`` is named on the deployment page with
    its behaviour."""
    from worker.factory import VERSIONING_BEHAVIOR

    page = " ".join((ROOT / "docs" / "deployment.md").read_text(encoding="utf-8").split())
    section = page.split("How the workflows follow new builds:", 1)[1].split("Rolling out", 1)[0]
    for cls, behavior in VERSIONING_BEHAVIOR.items():
        name = cls.__name__.removesuffix("Workflow")  # each class is its type's name + Workflow
        assert f"`{name}`" in section, name
        assert f"**{behavior.name}**" in section, behavior.name


def test_a_stale_block_is_reported(tmp_path: Path) -> None:
    """The check can fail: a page whose block lacks a setting is stale, and ``write``
    restores it."""
    page = tmp_path / "configuration.md"
    current = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    page.write_text(current.replace("| `BATON_REVIEW_TIMEOUT` |", "| `BATON_REVIEW_TIMEOT` |"))
    block = gen.Block("settings", page, gen.render_settings)
    assert block.current() != block.wanted()
    assert block.write() and block.current() == block.wanted()
    assert page.read_text(encoding="utf-8") == current


def test_the_site_builds_without_warnings(tmp_path: Path) -> None:
    """``mkdocs build --strict`` succeeds offline: every link, anchor and nav entry resolves."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    assert mkdocs is not None, "mkdocs is part of the dev extra (mkdocs-material)"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "architecture" / "index.html").is_file()
    assert "WARNING" not in done.stderr, done.stderr
