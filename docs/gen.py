"""The generated parts of the docs, so they cannot drift from the code.

Three blocks, each written between ``<!-- generated:NAME -->`` and
``<!-- end generated:NAME -->`` in a checked-in page (the prose around them is
written by hand):

- ``settings`` in ``docs/configuration.md``: every field of
  :class:`baton.settings.Settings` (variable, type, default, limits, meaning);
- ``cli`` in ``docs/reference/cli.md``: every ``baton`` command and option, by
  typer's own Markdown writer (``typer … utils docs``) over ``cli.main.app``;
- ``api`` in ``docs/reference/api.md``: every operation and schema of the API's
  OpenAPI document (``api.app.create_app().openapi()``).

``python -m docs.gen`` rewrites the blocks in place; ``python -m docs.gen --check``
changes nothing and exits 1 naming the stale pages. ``make docs`` runs the first,
then ``mkdocs build --strict``; ``tests/test_docs.py`` runs the comparison.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

Schema = dict[str, Any]


# --- JSON Schema → one line of Markdown (shared by the settings and the API) ---------


def prose(text: str) -> str:
    """A docstring as Markdown: Sphinx roles (``:class:`X```) become plain code spans."""
    return re.sub(r":[a-z]+:(`[^`]+`)", r"\1", text.strip())


def cell(text: object) -> str:
    """``text`` safe inside a Markdown table cell: one line, ``|`` escaped."""
    return " ".join(prose(str(text)).split()).replace("|", "\\|")


def type_of(schema: Schema, link: Callable[[str], str] | None = None) -> str:
    """A JSON Schema's type in a few words: ``string``, ``integer[]``, ``"off" | "on"``,
    ``SessionCreate`` (a ``$ref``, linked with ``link`` when given), ``X | null``."""
    if "$ref" in schema:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        return link(name) if link else name
    if "const" in schema:
        return json.dumps(schema["const"])
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " | ".join(type_of(s, link) for s in schema[key])
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return type_of(schema["allOf"][0], link)
    kind = schema.get("type")
    if kind == "array":
        if "prefixItems" in schema:
            return "[" + ", ".join(type_of(s, link) for s in schema["prefixItems"]) + "]"
        items = schema.get("items")
        return f"{type_of(items, link)}[]" if items else "array"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"{{string: {type_of(schema['additionalProperties'], link)}}}"
    if kind == "string" and schema.get("format") == "password":
        return "secret"
    if kind == "string" and schema.get("format") in ("date-time", "binary", "uri"):
        return f"string ({schema['format']})"
    if isinstance(kind, list):
        return " | ".join(str(k) for k in kind)
    return str(kind) if kind else "any"


_LIMITS = (
    ("exclusiveMinimum", "> {}"),
    ("minimum", "≥ {}"),
    ("exclusiveMaximum", "< {}"),
    ("maximum", "≤ {}"),
    ("minLength", "length ≥ {}"),
    ("maxLength", "length ≤ {}"),
    ("minItems", "items ≥ {}"),
    ("maxItems", "items ≤ {}"),
    ("pattern", "pattern `{}`"),
)


def limits_of(schema: Schema) -> str:
    """The schema's bounds (``> 0, ≤ 604800``), looking inside ``anyOf`` branches."""
    found: list[str] = []
    for part in [schema, *schema.get("anyOf", [])]:
        for key, fmt in _LIMITS:
            if key in part:
                value = part[key]
                value = int(value) if isinstance(value, float) and value.is_integer() else value
                found.append(fmt.format(value))
    return ", ".join(found)


def value_of(value: object) -> str:
    """A default as a person types it: ``true``, ``300``, ``"baton"`` → ``baton``."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        return value
    return json.dumps(value)


# --- settings ------------------------------------------------------------------------


def render_settings() -> str:
    """The settings table: one row per :class:`~baton.settings.Settings` field."""
    from pydantic_core import PydanticUndefined

    from baton.settings import Settings

    prefix = str(Settings.model_config.get("env_prefix", ""))
    schema = Settings.model_json_schema()["properties"]
    rows = [
        "| variable | default | type | meaning |",
        "| --- | --- | --- | --- |",
    ]
    for name, field in Settings.model_fields.items():
        prop = schema[name]
        if field.default is not PydanticUndefined:
            default = cell(value_of(field.default))
            default = default if field.default is None else f"`{default}`"
        elif field.default_factory in (dict, list):
            default = f"`{value_of(field.default_factory())}`"
        else:  # computed when the settings load (the meaning says how)
            default = "computed"
        kind = ", ".join(filter(None, (type_of(prop), limits_of(prop))))
        rows.append(
            f"| `{prefix}{name.upper()}` | {default} | {cell(kind)} "
            f"| {cell(field.description or '')} |"
        )
    return "\n".join(rows)


# --- CLI -----------------------------------------------------------------------------


def render_cli() -> str:
    """Every command of ``baton`` with its usage, arguments and options (typer's
    ``utils docs`` writer, headings one level down so the page keeps its title)."""
    import typer
    from typer.cli import get_docs_for_click

    from cli.main import app

    command = typer.main.get_command(app)
    text = get_docs_for_click(obj=command, ctx=typer.Context(command), indent=1, name="baton")
    return text.strip()


def cli_commands() -> list[str]:
    """Every command path users type, ``baton`` first: ``baton db upgrade``, …"""
    import typer

    from cli.main import app

    def walk(command: Any, path: str) -> list[str]:
        found = [path]
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            found += walk(sub, f"{path} {name}")
        return found

    return walk(typer.main.get_command(app), "baton")


# --- HTTP API ------------------------------------------------------------------------


def openapi() -> Schema:
    """The API's OpenAPI document, as ``GET /openapi.json`` serves it."""
    from api.app import create_app

    document: Schema = create_app().openapi()
    return document


def _anchor(name: str) -> str:
    """The id mkdocs gives the heading ``### name`` (its default slugify)."""
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", name).strip().lower())


def _schema_link(name: str) -> str:
    return f"[{name}](#{_anchor(name)})"


def _content_type(content: Schema) -> str:
    for media in content.values():
        if media.get("schema"):
            return type_of(media["schema"], _schema_link)
    return ", ".join(f"`{m}`" for m in content)


def _operation(method: str, path: str, op: Schema) -> list[str]:
    out = [f"### `{method.upper()} {path}`", ""]
    if op.get("summary"):
        out += [f"**{op['summary']}.**", ""]
    if op.get("description"):
        out += [prose(op["description"]), ""]
    params = [p for p in op.get("parameters", []) if p["name"] != "authorization"]
    if params:
        out += ["| parameter | in | type | required | default | limits | meaning |"]
        out += ["| --- | --- | --- | --- | --- | --- | --- |"]
        for p in params:
            s = p.get("schema", {})
            default = f"`{cell(value_of(s['default']))}`" if "default" in s else ""
            meaning = p.get("description") or s.get("description") or ""
            out.append(
                f"| `{p['name']}` | {p['in']} | {cell(type_of(s, _schema_link))} "
                f"| {'yes' if p.get('required') else 'no'} | {default} "
                f"| {cell(limits_of(s))} | {cell(meaning)} |"
            )
        out.append("")
    body = op.get("requestBody")
    if body:
        media = ", ".join(f"`{m}`" for m in body.get("content", {}))
        out += [f"**Body** ({media}): {_content_type(body.get('content', {}))}", ""]
    out += ["| status | meaning | body |", "| --- | --- | --- |"]
    for status, response in sorted(op.get("responses", {}).items()):
        content = response.get("content", {})
        out.append(
            f"| {status} | {cell(response.get('description', ''))} "
            f"| {cell(_content_type(content)) if content else ''} |"
        )
    return [*out, ""]


def _schema(name: str, schema: Schema) -> list[str]:
    out = [f"### {name}", ""]
    if schema.get("description"):
        out += [prose(schema["description"]), ""]
    props: Schema = schema.get("properties", {})
    if not props:
        out += [f"Type: {type_of(schema, _schema_link)}.", ""]
        return out
    required = set(schema.get("required", []))
    out += ["| field | type | required | default | limits | meaning |"]
    out += ["| --- | --- | --- | --- | --- | --- |"]
    for field, s in props.items():
        default = f"`{cell(json.dumps(s['default']))}`" if "default" in s else ""
        out.append(
            f"| `{field}` | {cell(type_of(s, _schema_link))} "
            f"| {'yes' if field in required else 'no'} | {default} "
            f"| {cell(limits_of(s))} | {cell(s.get('description', ''))} |"
        )
    if schema.get("additionalProperties") is False:
        out += ["", "Unknown fields are refused."]
    return [*out, ""]


def render_api() -> str:
    """Every operation of the OpenAPI document grouped by tag, then every schema."""
    document = openapi()
    by_tag: dict[str, list[str]] = {}
    for path, methods in document["paths"].items():
        for method, op in methods.items():
            tag = (op.get("tags") or ["other"])[0]
            by_tag.setdefault(tag, []).extend(_operation(method, path, op))
    info = document["info"]
    out = [f"OpenAPI {document['openapi']} · {info['title']} {info['version']}.", ""]
    for tag, lines in by_tag.items():
        out += [f"## {tag}", "", *lines]
    out += ["## Schemas", ""]
    for name, schema in sorted(document["components"]["schemas"].items()):
        out += _schema(name, schema)
    return "\n".join(out).strip()


def api_operations() -> list[str]:
    """Every ``METHOD /path`` of the OpenAPI document."""
    return [
        f"{method.upper()} {path}"
        for path, methods in openapi()["paths"].items()
        for method in methods
    ]


# --- the blocks in their pages ---------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """One generated block: its name, the page that holds it, and what writes it."""

    name: str
    page: Path
    render: Callable[[], str]

    def pattern(self) -> re.Pattern[str]:
        """The block with its markers, in its page (group 1 is the generated text)."""
        return re.compile(
            rf"(?<=<!-- generated:{self.name} -->\n)(.*?)(?=<!-- end generated:{self.name} -->)",
            re.S,
        )

    def current(self) -> str:
        """The block's text as checked in (raises LookupError when the markers are gone)."""
        found = self.pattern().search(self.page.read_text(encoding="utf-8"))
        if found is None:
            msg = f"{self.page}: no <!-- generated:{self.name} --> … <!-- end … --> markers"
            raise LookupError(msg)
        return found.group(1)

    def wanted(self) -> str:
        """The block as the code makes it now (a blank line either side)."""
        return f"\n{self.render()}\n\n"

    def write(self) -> bool:
        """Rewrite the block in its page; returns whether anything changed."""
        text = self.page.read_text(encoding="utf-8")
        if self.current() == self.wanted():
            return False
        wanted = self.wanted()
        self.page.write_text(self.pattern().sub(lambda _: wanted, text, count=1), "utf-8")
        return True


BLOCKS = (
    Block("settings", DOCS / "configuration.md", render_settings),
    Block("cli", DOCS / "reference" / "cli.md", render_cli),
    Block("api", DOCS / "reference" / "api.md", render_api),
)


def main(argv: list[str]) -> int:
    """``python -m docs.gen [--check]``: rewrite the blocks, or name the stale ones."""
    if "--check" in argv:
        stale = [b for b in BLOCKS if b.current() != b.wanted()]
        for b in stale:
            print(f"stale: {b.page.relative_to(ROOT)} ({b.name}); run `python -m docs.gen`")
        return 1 if stale else 0
    for b in BLOCKS:
        if b.write():
            print(f"wrote {b.page.relative_to(ROOT)} ({b.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
