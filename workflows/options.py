"""Named activity option presets. Changing a value changes new commands only; in-flight
activities keep the options they were scheduled with.

Timeouts and the model call's attempt budget are engine settings (``BATON_*`` →
:class:`~baton.contracts.SessionConfig`, whose field defaults are the defaults), so a
workflow receives them as input; the helpers here turn that config into options.
Temporal's replay compares an activity command's type and id, not its timeouts or
retry policy, so changing these never breaks a run already in flight (the replay
suite checks it).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

from baton.contracts.workflow_io import SessionConfig

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

#: Delegations attach to what an earlier attempt started (ids derive from the
#: delegation id), so retrying is safe; a few attempts ride out a Temporal blip.
DELEGATE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
)


def model_retry(cfg: SessionConfig) -> RetryPolicy:
    """MODEL_RETRY with ``cfg.model_attempts`` attempts.

    Attempts count worker losses too, so there are many; provider failures are
    counted by ``model_turn`` itself (heartbeat details), which fails the call for
    good (non-retryable) after ``cfg.model_provider_failures`` of them. A crash loop
    therefore no longer spends a turn's provider retries.
    """
    return RetryPolicy(
        initial_interval=MODEL_RETRY.initial_interval,
        backoff_coefficient=MODEL_RETRY.backoff_coefficient,
        maximum_interval=MODEL_RETRY.maximum_interval,
        maximum_attempts=max(cfg.model_attempts, 1),
    )


def store_timeout(cfg: SessionConfig) -> timedelta:
    """Start-to-close of a DB-only activity: what a worker lost mid-activity costs."""
    return timedelta(seconds=cfg.store_timeout_s)


def tool_timeout(cfg: SessionConfig) -> timedelta:
    """Start-to-close of a tool call (ordinary or X-Agent); tools also heartbeat."""
    return timedelta(seconds=cfg.tool_timeout_s)


def heartbeat_timeout(cfg: SessionConfig) -> timedelta:
    """Heartbeat timeout of long activities; they beat at half of it."""
    return timedelta(seconds=cfg.heartbeat_timeout_s)
