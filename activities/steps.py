"""Activities of AgentStepWorkflow: check a deliverable against its JSON Schema and
record the step's state (issue 6; seed 004 'One Agent, two execution experiences')."""

from __future__ import annotations

import json
import re

import jsonschema
from sqlalchemy.engine import Engine
from temporalio import activity
from temporalio.exceptions import ApplicationError

from baton import sessions
from baton.contracts import STEP_CLOSED, DeliverableCheck, DeliverableResult, StepUpdate
from baton.db import StepRow, session_scope, utcnow

#: Validation errors fed back to the model per attempt.
MAX_ERRORS = 10
_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.S)


def parse_deliverable(text: str, schema: dict[str, object] | None) -> DeliverableResult:
    """The deliverable in ``text``: JSON validated against ``schema`` (code fences allowed);
    without a schema, the text itself."""
    if schema is None:
        return DeliverableResult(ok=True, deliverable=text)
    fenced = _FENCE.match(text)
    raw = fenced.group(1) if fenced else text
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return DeliverableResult(ok=False, errors=[f"the reply is not JSON: {exc}"])
    validator = jsonschema.Draft202012Validator(schema)
    try:
        errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
    except Exception as exc:  # referencing.Unresolvable and kin: the schema, not the reply
        raise ApplicationError(
            f"invalid_schema: the output schema cannot be applied: {exc}", non_retryable=True
        ) from exc
    if not errors:
        return DeliverableResult(ok=True, deliverable=value)
    return DeliverableResult(
        ok=False,
        errors=[
            f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
            for e in errors[:MAX_ERRORS]
        ],
    )


class StepActivities:
    """``check_deliverable`` and ``update_step``, built with the DB engine."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    @activity.defn(name="check_deliverable")
    def check_deliverable(self, inp: DeliverableCheck) -> DeliverableResult:
        """Parse and validate the final message of an attempt (read from the DB)."""
        with session_scope(self._engine) as s:
            row = sessions.get_message(s, message_id=inp.message_id)
            text = row.text if row else ""
        return parse_deliverable(text, inp.output_schema)

    @activity.defn(name="update_step")
    def update_step(self, inp: StepUpdate) -> None:
        """Record the step's status, attempts, deliverable and error (closed states are final)."""
        with session_scope(self._engine) as s:
            row = s.get(StepRow, inp.step_id)
            if row is None or row.status in STEP_CLOSED:
                return
            row.status = inp.status
            row.attempts = inp.attempts
            row.deliverable = inp.deliverable
            row.error = inp.error
            row.updated_at = utcnow()
            s.add(row)
