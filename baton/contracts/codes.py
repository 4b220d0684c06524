"""Machine-readable codes a client or a model reads: the ApplicationError types
workflows and activities raise, and the refusal codes of tool results (docs/api.md).

A code, once shipped, never changes: clients and stored tool results match on it.
The guards' own codes live with the guard (:mod:`baton.permissions.guard`).
"""

from __future__ import annotations

#: ApplicationError types the send_message Update rejects or fails with.
SESSION_BUSY = "session_busy"
QUEUE_FULL = "queue_full"
SESSION_CLOSED = "session_closed"
INVALID_PROMPT = "invalid_prompt"
#: Refusal code of a tool call a stored ``block`` policy refuses.
BLOCKED_BY_POLICY = "blocked_by_policy"
#: Refusal codes of a delegation: a limit (depth, spawns, token budget) or the balance.
LIMIT_EXCEEDED = "limit_exceeded"
BALANCE_EXHAUSTED = "balance_exhausted"
#: A step's deliverable that does not match its output schema.
INVALID_DELIVERABLE = "invalid_deliverable"
#: The ApplicationError type a step's workflow fails with when the step
#: ends ``failed`` or ``rejected`` (so the Temporal UI lists it under ExecutionStatus =
#: "Failed"); the step row keeps the status and error the API reports.
HANDOFF_TIMEOUT = "handoff_timeout"
STEP_TIMEOUT = "step_timeout"
STEP_REJECTED = "step_rejected"
TOO_MANY_ATTEMPTS = "too_many_attempts"
ATTEMPT_FAILED = "attempt_failed"
#: ApplicationError type: send_message on an external session (no model turn runs there).
SESSION_EXTERNAL = "session_external"
#: ApplicationError type: an external Update on a session that is not external.
NOT_EXTERNAL = "not_external"
#: ApplicationError type: an external tool call naming anything but the five X-Agent tools.
UNKNOWN_TOOL = "unknown_tool"
#: Workspace refusals (docs/workspaces.md): a tool error the model reads, or the 4xx
#: problem+json of the files API.
INVALID_PATH = "invalid_path"
FILE_NOT_FOUND = "file_not_found"
FILE_TOO_LARGE = "file_too_large"
TOO_MANY_FILES = "too_many_files"
WORKSPACE_QUOTA_EXCEEDED = "workspace_quota_exceeded"
CONTENT_TYPE_REFUSED = "content_type_refused"
WORKSPACE_READ_ONLY = "workspace_read_only"
#: A replay's call with no recording to answer it (docs/change-safely.md, Replay against a
#: candidate): a tool miss under ``on_miss: fail``, an unrecorded invoke, a review whose
#: recorded outcome does not match.
EVAL_UNRECORDED = "eval_unrecorded"
#: Problem codes of evals and the publish gate (docs/change-safely.md): no eval with that
#: id the caller may read; publishing under a gate with no completed eval of the draft;
#: an eval that does not meet the gate (another draft or agent, not completed, or over a
#: limit).
EVAL_NOT_FOUND = "eval_not_found"
EVAL_REQUIRED = "eval_required"
EVAL_FAILED = "eval_failed"
