"""A step's ``output_schema``: which JSON Schemas are accepted, and the validator that runs them.

JSON Schema 2020-12 (Xema Agent Concepts, workflow-agent steps; docs/steps.md). Python's
``re`` holds the GIL and backtracks exponentially (``"pattern": "^(a+)+$"`` on 28 ``a``
and ``!`` stalled the whole process for 15.8 s), so no user pattern
ever runs on it: ``pattern``, ``patternProperties`` and the ``additionalProperties``
check that consults
``patternProperties`` run on :mod:`baton.saferegex` (the `regex` module, time-limited,
GIL released). A pattern that times out on a value is a validation error fed back to the
model like any other. ``unevaluatedProperties`` consults ``patternProperties`` through
jsonschema's own ``re`` calls, so a schema using both is refused at ``POST /v1/steps``.

Pure and I/O-free.
"""

from __future__ import annotations

import contextvars
import re
import time
from collections.abc import Iterator
from typing import Any

import jsonschema
from jsonschema import ValidationError
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from baton import saferegex
from baton.contracts.codes import INVALID_DELIVERABLE
from baton.contracts.workflow_io import HandoffDecision
from baton.errors import BatonError
from baton.payloads import MAX_PAYLOAD_DEPTH, MAX_RESULT_BYTES, json_bytes, nesting_depth

#: Time one pattern may take on one value, and all patterns on one deliverable (seconds).
PATTERN_TIMEOUT_S = 0.1
PATTERNS_BUDGET_S = 1.0
#: Longest value quoted in a validation error (the model wrote it; it needs only a glimpse).
QUOTE_CHARS = 80
#: A reply that is one fenced code block (```json … ``` or ``` … ```): its content is the JSON.
_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.S)


class InvalidSchema(BatonError):
    """``output_schema`` is not a JSON Schema (2020-12) Baton can apply (422)."""

    code = "invalid_schema"
    status = 422
    title = "Invalid JSON Schema"


class InvalidEdit(BatonError):
    """An edited deliverable on a handoff decision other than approve, or one the step's
    output schema refuses (without a schema a deliverable is text) (422)."""

    code = INVALID_DELIVERABLE
    status = 422
    title = "The edited deliverable is not acceptable"


_deadline: contextvars.ContextVar[float] = contextvars.ContextVar("pattern_deadline")


def unfence(text: str) -> str:
    """The JSON text of a reply: the content of its code fence when the whole reply is
    one fenced block, else the reply itself (the step's check and the console's rendering
    of each attempt read a reply the same way)."""
    fenced = _FENCE.match(text)
    return fenced.group(1) if fenced else text


def _quote(value: str) -> str:
    return repr(value if len(value) <= QUOTE_CHARS else value[:QUOTE_CHARS] + "…")


def _search(pattern: str, text: str) -> bool | None:
    """Whether ``pattern`` is found in ``text``; None when the time ran out."""
    left = _deadline.get(time.monotonic() + PATTERNS_BUDGET_S) - time.monotonic()
    try:
        return saferegex.search(pattern, text, timeout=min(PATTERN_TIMEOUT_S, left))
    except saferegex.PatternTimeout:
        return None


def _timed_out(pattern: str, text: str) -> ValidationError:
    return ValidationError(
        f"{_quote(text)} could not be checked against {pattern!r} in time "
        "(the pattern backtracks too much on it); use a simpler value"
    )


def _pattern(
    validator: Any, pattern: str, instance: Any, _schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    found = _search(pattern, instance)
    if found is None:
        yield _timed_out(pattern, instance)
    elif not found:
        yield ValidationError(f"{_quote(instance)} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, _schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            found = _search(pattern, key)
            if found is None:
                yield _timed_out(pattern, key)
            elif found:
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any, additional: Any, instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    """jsonschema's ``additionalProperties`` with its ``patternProperties`` lookup made safe."""
    if not validator.is_type(instance, "object"):
        return
    known = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = []
    for key in instance:
        if key in known:
            continue
        results = [_search(p, key) for p in patterns]
        if None in results:
            yield _timed_out("|".join(patterns), key)
        elif not any(results):
            extras.append(key)
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif additional is False and extras:
        shown = ", ".join(_quote(str(e)) for e in sorted(extras, key=str)[:10])
        yield ValidationError(f"Additional properties are not allowed ({shown} unexpected)")


# types-jsonschema leaves `extend` untyped; the class it returns is a Draft 2020-12 validator.
DeliverableValidator: Any = jsonschema.validators.extend(  # type: ignore[no-untyped-call]
    jsonschema.Draft202012Validator,
    validators={
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    },
)
"""Draft 2020-12 with every user pattern on :mod:`baton.saferegex`."""


def _regex_format_checker() -> jsonschema.FormatChecker:
    """The meta-schema's ``format: regex`` (every ``pattern`` and ``patternProperties`` key),
    checked by compiling with :func:`baton.saferegex.compile_user_pattern`."""
    checker = jsonschema.FormatChecker(formats=())

    @checker.checks("regex", raises=ValueError)
    def _compiles(instance: object) -> bool:
        if isinstance(instance, str):
            saferegex.compile_user_pattern(instance)
        return True

    return checker


_FORMATS = _regex_format_checker()


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def check_output_schema(schema: dict[str, Any]) -> None:
    """Raise :class:`InvalidSchema` unless Baton can apply ``schema`` to deliverables.

    Refused: nesting past ``MAX_PAYLOAD_DEPTH`` (32; the schema travels in the workflow
    input), anything the 2020-12 meta-schema refuses, a pattern the `regex` module cannot
    compile or that expands past ``saferegex.MAX_EXPANDED_SIZE``, ``unevaluatedProperties``
    beside ``patternProperties`` (see the module docstring), and a ``$ref`` that does not
    resolve inside the schema (it would only fail once a deliverable is checked).
    """
    if nesting_depth(schema) > MAX_PAYLOAD_DEPTH:
        raise InvalidSchema(
            f"output_schema: nested deeper than {MAX_PAYLOAD_DEPTH} levels", path="output_schema"
        )
    try:
        DeliverableValidator.check_schema(schema, format_checker=_FORMATS)
    except jsonschema.SchemaError as exc:
        raise InvalidSchema(f"output_schema: {exc.message}", path="output_schema") from exc
    nodes = list(_walk(schema))
    keywords = {key for node in nodes for key in node}
    if {"unevaluatedProperties", "patternProperties"} <= keywords:
        raise InvalidSchema(
            "output_schema: unevaluatedProperties cannot be combined with patternProperties "
            "(use additionalProperties)",
            path="output_schema",
        )
    resolver = Registry().with_resource("", DRAFT202012.create_resource(schema)).resolver()
    for ref in (n["$ref"] for n in nodes if isinstance(n.get("$ref"), str)):
        try:
            resolver.lookup(ref)
        except Exception as exc:  # referencing.exceptions.Unresolvable and kin
            raise InvalidSchema(
                f"output_schema: $ref {ref!r} does not resolve", path="output_schema"
            ) from exc


def deliverable_errors(value: Any, schema: dict[str, Any]) -> list[ValidationError]:
    """Every way ``value`` breaks ``schema`` (checked with :func:`check_output_schema`),
    sorted by location; the patterns share :data:`PATTERNS_BUDGET_S` in total."""
    token = _deadline.set(time.monotonic() + PATTERNS_BUDGET_S)
    try:
        errors = DeliverableValidator(schema).iter_errors(value)
        return sorted(errors, key=lambda e: [str(p) for p in e.absolute_path])
    finally:
        _deadline.reset(token)


def check_edit(decision: HandoffDecision, schema: dict[str, Any] | None) -> None:
    """Raise :class:`InvalidEdit` unless ``decision`` carries no edited deliverable or
    approves with one ``schema`` accepts (docs/steps.md, Handoff): only an approve carries
    an edit; without a schema it is text; it nests at most ``MAX_PAYLOAD_DEPTH`` levels,
    takes at most ``MAX_RESULT_BYTES`` as JSON and passes :func:`deliverable_errors`, the
    check every attempt's deliverable passes. The one rule the API applies before it
    signals ``handoff`` and the step's ``check_edited_deliverable`` activity applies to a
    Signal sent straight to Temporal."""
    edit = decision.edited_deliverable
    if edit is None:
        return
    if decision.decision != "approve":
        raise InvalidEdit("only an approve carries an edited deliverable", path="decision")
    if schema is None:
        if not isinstance(edit, str):
            raise InvalidEdit("this step has no output_schema: its deliverable is text")
        return
    if nesting_depth(edit) > MAX_PAYLOAD_DEPTH:
        raise InvalidEdit(f"the edit nests deeper than {MAX_PAYLOAD_DEPTH} levels")
    if json_bytes(edit) > MAX_RESULT_BYTES:
        raise InvalidEdit(f"the edit is larger than {MAX_RESULT_BYTES} bytes as JSON")
    errors = deliverable_errors(edit, schema)
    if errors:
        where = "/".join(str(p) for p in errors[0].absolute_path) or "deliverable"
        raise InvalidEdit(
            f"{where}: {errors[0].message}", path="edited_deliverable", error_count=len(errors)
        )
