"""Activities of AgentStepWorkflow: check a deliverable against its JSON Schema and
record the step's state (Xema Agent Concepts 'One Agent, two execution experiences')."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.engine import Engine
from temporalio import activity
from temporalio.exceptions import ApplicationError

from baton.contracts.activity_io import (
    DeliverableCheck,
    DeliverableResult,
    EditCheck,
    StepUpdate,
)
from baton.contracts.values import STEP_CLOSED
from baton.errors import BatonError
from baton.payloads import (
    MAX_PAYLOAD_DEPTH,
    MAX_RESULT_BYTES,
    ensure_fits,
    json_bytes,
    nesting_depth,
)
from baton.runs import deliverables, session_store
from baton.storage.db import StepRow, session_scope, utcnow
from baton.webhooks import events as webhook_events

#: Validation errors fed back to the model per attempt, and the length of each.
MAX_ERRORS = 10
MAX_ERROR_CHARS = 300
#: Room left in a result for its errors and field names beside the deliverable.
RESULT_HEADROOM = 16 * 1024


def _refused(error: str) -> DeliverableResult:
    return DeliverableResult(ok=False, errors=[error])


def parse_deliverable(text: str, schema: dict[str, Any] | None) -> DeliverableResult:
    """The deliverable in ``text``: JSON validated against ``schema`` (code fences allowed);
    without a schema, the text itself.

    Everything wrong with the reply comes back as ``ok=False`` with errors to feed back to
    the model, never as an exception (a retry would fail the same way):
    not JSON, nested past ``MAX_PAYLOAD_DEPTH``, larger than ``MAX_RESULT_BYTES`` once
    encoded, or not valid (a pattern that times out is a validation error too, see
    :mod:`baton.runs.deliverables`). A schema that cannot be applied raises a non-retryable
    ``invalid_schema`` ApplicationError: that is the step's fault, not the reply's.
    """
    if schema is None:
        if json_bytes(text) > MAX_RESULT_BYTES - RESULT_HEADROOM:
            return _refused(f"the reply is larger than {MAX_RESULT_BYTES} bytes; shorten it")
        return DeliverableResult(ok=True, deliverable=text)
    try:
        value = json.loads(deliverables.unfence(text))
    except RecursionError:
        return _refused(f"the reply nests deeper than {MAX_PAYLOAD_DEPTH} levels")
    except ValueError as exc:
        return _refused(f"the reply is not JSON: {str(exc)[:MAX_ERROR_CHARS]}")
    if nesting_depth(value) > MAX_PAYLOAD_DEPTH:
        return _refused(f"the reply nests deeper than {MAX_PAYLOAD_DEPTH} levels")
    if json_bytes(value) > MAX_RESULT_BYTES - RESULT_HEADROOM:
        return _refused(f"the reply is larger than {MAX_RESULT_BYTES} bytes as JSON; shorten it")
    try:
        deliverables.check_output_schema(schema)
        errors = deliverables.deliverable_errors(value, schema)
    except Exception as exc:  # InvalidSchema, referencing.Unresolvable: the schema, not the reply
        detail = exc.detail if isinstance(exc, BatonError) else str(exc)
        raise ApplicationError(
            f"invalid_schema: the output schema cannot be applied: {detail}",
            type="invalid_schema",
            non_retryable=True,
        ) from exc
    if not errors:
        return DeliverableResult(ok=True, deliverable=value)
    return DeliverableResult(
        ok=False,
        errors=[
            f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"[
                :MAX_ERROR_CHARS
            ]
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
            row = session_store.get_message(s, message_id=inp.message_id)
            text = row.text if row else ""
        return ensure_fits(parse_deliverable(text, inp.output_schema), what="deliverable check")

    @activity.defn(name="check_edited_deliverable")
    def check_edited_deliverable(self, inp: EditCheck) -> DeliverableResult:
        """Whether a handoff's edited deliverable is acceptable
        (:func:`baton.runs.deliverables.check_edit`, the check the API makes before it
        signals): ``ok``, or ``ok=False`` with why, for a Signal that bypassed the API.
        No I/O; an activity because the check's pattern budget reads the clock."""
        try:
            deliverables.check_edit(inp.decision, inp.output_schema)
        except BatonError as exc:  # InvalidEdit
            return _refused(exc.detail[:MAX_ERROR_CHARS])
        except Exception as exc:  # a schema that cannot be applied: the edit is not taken
            return _refused(f"the edit could not be checked: {str(exc)[:MAX_ERROR_CHARS]}")
        return DeliverableResult(ok=True)

    @activity.defn(name="update_step")
    def update_step(self, inp: StepUpdate) -> None:
        """Record the step's status, attempts, deliverable and error (closed states are final),
        and the webhook events of the change (handoff opened or resolved, step failed)."""
        with session_scope(self._engine) as s:
            row = s.get(StepRow, inp.step_id)
            if row is None or row.status in STEP_CLOSED:
                return
            before = row.status
            row.status = inp.status
            row.attempts = inp.attempts
            row.deliverable = inp.deliverable
            row.error = inp.error
            row.updated_at = utcnow()
            s.add(row)
            webhook_events.step_changed(s, row, before=before, deadline=inp.handoff_deadline)
