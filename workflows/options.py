"""Named activity option presets. Changing a value changes new commands only; in-flight
activities keep the options they were scheduled with."""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

#: Model calls: transient provider errors retried with backoff; non-retryable
#: ApplicationErrors (auth, validation, configuration) end the turn at once.
MODEL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=6,
)

#: DB-only activities: quick, idempotent, retried a few times.
STORE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=10,
)
STORE_TIMEOUT = timedelta(seconds=30)
TOOL_TIMEOUT = timedelta(seconds=60)

#: Delegations attach to what an earlier attempt started (ids derive from the
#: delegation id), so retrying is safe; a few attempts ride out a Temporal blip.
DELEGATE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
)
