"""The console's agent page: an agent's revisions as text, a diff between any two of
them (or the draft), and the YAML the draft editor shows and reads back.

Every change is made in the browser through the API's own calls (``PUT …/draft``,
``POST …/publish|restore|rollback|retire``, as ``baton`` makes them); this module only
renders and parses.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

import yaml

from baton.errors import BatonError

#: The largest spec text the editor's parser reads (characters), as the API's body limit
#: would refuse a larger spec anyway.
MAX_SPEC_CHARS = 256_000


class InvalidSpecText(BatonError):
    """The draft editor's text is not YAML / JSON, or not a mapping (422)."""

    code = "invalid_spec_text"
    status = 422
    title = "The spec text does not parse"


def spec_text(spec: dict[str, Any], fmt: str = "yaml") -> str:
    """``spec`` as the editor shows it: YAML (block style, keys in the spec's order) or
    indented JSON (``fmt="json"``)."""
    if fmt == "json":
        return json.dumps(spec, indent=2, ensure_ascii=False) + "\n"
    return yaml.safe_dump(spec, sort_keys=False, allow_unicode=True, default_flow_style=False)


def parse_spec_text(text: str, fmt: str) -> dict[str, Any]:
    """The editor's text as a spec mapping (not validated: the API's ``PUT …/draft`` does
    that). Raises :class:`InvalidSpecText` with the line (1-based) of a syntax error."""
    if len(text) > MAX_SPEC_CHARS:
        raise InvalidSpecText(f"the spec is longer than {MAX_SPEC_CHARS} characters")
    try:
        data = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise InvalidSpecText(f"line {exc.lineno}: {exc.msg}", line=exc.lineno) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        what = getattr(exc, "problem", None) or "not YAML"
        raise InvalidSpecText(f"line {line}: {what}" if line else str(what), line=line) from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InvalidSpecText("the spec must be a mapping of fields (system_prompt, model, …)")
    return data


def diff_lines(old: str, new: str, old_label: str, new_label: str) -> list[dict[str, str]]:
    """A unified diff (3 lines of context) as ``[{kind, text}]``, ``kind`` one of ``head``,
    ``hunk``, ``add``, ``del``, ``same``; empty when the texts are equal."""
    out = []
    for line in difflib.unified_diff(
        old.splitlines(), new.splitlines(), old_label, new_label, lineterm=""
    ):
        if line.startswith(("---", "+++")):
            kind = "head"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "same"
        out.append({"kind": kind, "text": line})
    return out
