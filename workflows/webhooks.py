"""WebhookDeliveryWorkflow: one webhook delivery, id = the delivery id (docs/webhooks.md).

Its one activity sends the signed body; Temporal retries it with exponential backoff
(``DeliveryInput.config``) across unreachable receivers, non-2xx answers and lost workers.
When the attempts run out the delivery is logged failed and the workflow completes: a
receiver's failure is the log's news, not a failed workflow.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.webhooks import WebhookActivities
    from baton.contracts.activity_io import DeliveryFailure
    from baton.contracts.workflow_io import DeliveryInput
    from workflows.options import STORE_RETRY

#: Seconds a delivery's bookkeeping activity may take.
FAIL_TIMEOUT_S = 30.0
#: Seconds beyond the POST's own bound that an attempt may take (two DB writes).
ATTEMPT_SLACK_S = 10.0


@workflow.defn(name="WebhookDelivery")
class WebhookDeliveryWorkflow:
    """One delivery. Input: :class:`DeliveryInput`; result: its final status."""

    @workflow.run
    async def run(self, inp: DeliveryInput) -> str:
        """Attempt until delivered, refused, cancelled or out of attempts."""
        cfg = inp.config
        try:
            return await workflow.execute_activity_method(
                WebhookActivities.deliver_webhook,
                inp,
                start_to_close_timeout=timedelta(seconds=cfg.timeout_s + ATTEMPT_SLACK_S),
                # A worker lost mid-POST is noticed this fast, whatever the POST's bound.
                heartbeat_timeout=timedelta(seconds=max(cfg.timeout_s, 2.0)),
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=cfg.retry_initial_s),
                    backoff_coefficient=2.0,
                    maximum_interval=timedelta(seconds=cfg.retry_max_s),
                    maximum_attempts=cfg.max_attempts,
                ),
                summary=f"deliver {inp.delivery_id}",
            )
        except ActivityError as err:
            cause = err.cause
            error = str(cause.message) if isinstance(cause, ApplicationError) else str(cause or err)
            await workflow.execute_activity_method(
                WebhookActivities.fail_delivery,
                DeliveryFailure(delivery_id=inp.delivery_id, error=error),
                start_to_close_timeout=timedelta(seconds=FAIL_TIMEOUT_S),
                retry_policy=STORE_RETRY,
                summary="log the failure",
            )
            return "failed"
