"""What an activity may hand back to a workflow: the size and nesting bounds of a result.

Temporal stores every activity result in the workflow's history. A payload over the
blob limit (``limit.blobSize.error``, 2 MiB by default; a warning past
``limit.blobSize.warn``, 512 KiB, where temporalio 1.35's ``PayloadLimitsConfig`` warns
too) is refused before upload by the SDK core (``temporalio_common::payload_limits``:
``[TMPRL1103] Attempted to upload payloads with size that exceeded the error limit``,
``limit=2097152``), and a refused result fails the activity the same way on every retry
(a model turn retried 6 times, ~32 s, for nothing). The workflow's
payload decoder also has a recursion limit the activity's encoder does not. So results
are bounded here, before they are returned, and what would break a bound is turned into
something the model can act on (a tool error, a validation error fed back) where the
caller can, and into a non-retryable ``result_too_large`` error everywhere else.

Big content never needs to cross the boundary: transcripts live in the DB and results
carry ids and previews (claim-check, docs/sessions.md); only tool-call arguments and a step's
deliverable are carried whole, and those are what these bounds are for.

Pure and I/O-free: safe to import from workflow code.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel
from temporalio.exceptions import ApplicationError

#: Largest encoded activity result (bytes): the server's warning size, a quarter of its
#: default hard limit, so a result never nears the point where it is refused.
MAX_RESULT_BYTES = 512 * 1024
#: Deepest JSON nesting carried to a workflow (its payload decoder's recursion limit is
#: far below what an activity can encode).
MAX_PAYLOAD_DEPTH = 32
#: Error type of a result that cannot be shrunk to fit (never retried).
RESULT_TOO_LARGE = "result_too_large"

M = TypeVar("M", bound=BaseModel)


def nesting_depth(value: Any, limit: int = MAX_PAYLOAD_DEPTH) -> int:
    """Nesting depth of a JSON-like value (a scalar is 0, ``[]`` or ``{}`` is 1, ``[[1]]`` 2).

    Iterative, so any depth is measured without recursion; stops counting at ``limit + 1``
    (the caller only needs to know the bound is passed).
    """
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            level += 1
            deepest = max(deepest, level)
            if deepest > limit:
                return deepest
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level) for child in children)
    return deepest


def json_bytes(value: Any) -> int:
    """Encoded size (bytes of UTF-8 JSON) of a JSON-like value or a pydantic model."""
    if isinstance(value, BaseModel):
        return len(value.model_dump_json().encode())
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def ensure_fits(result: M, *, what: str) -> M:
    """Return ``result`` when it encodes within :data:`MAX_RESULT_BYTES`, else raise.

    Raises a non-retryable ``ApplicationError`` of type ``result_too_large`` naming
    ``what`` and both sizes: sending it would fail identically on every attempt.
    """
    size = json_bytes(result)
    if size > MAX_RESULT_BYTES:
        raise ApplicationError(
            f"{RESULT_TOO_LARGE}: the {what} is {size} bytes; an activity result may be at "
            f"most {MAX_RESULT_BYTES} bytes",
            type=RESULT_TOO_LARGE,
            non_retryable=True,
        )
    return result
