"""Webhook deliveries (docs/webhooks.md): ``deliver_webhook`` sends one signed attempt,
``fail_delivery`` records a delivery that ran out of attempts, and :class:`DeliveryStarter`
starts the ``WebhookDelivery`` workflow of each delivery a transaction wrote
(:mod:`baton.webhooks.events`), before it commits.

A delivery is one workflow (id = delivery id, so starting it twice starts one) whose one
activity Temporal retries with backoff: an unreachable receiver, a non-2xx answer and a
worker killed mid-POST all end in another attempt of the same body under the same
``webhook-id``, which a receiver dedups by. Every attempt is logged on the delivery row.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import httpx2
from sqlalchemy.engine import Engine
from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError

from activities.outbound_http import http_client
from activities.outcomes import heartbeating
from baton.contracts.activity_io import DeliveryFailure
from baton.contracts.values import DeliveryConfig
from baton.contracts.workflow_io import DeliveryInput
from baton.outbound import OPEN, OutboundPolicy, OutboundRefused
from baton.storage.db import WebhookDeliveryRow, WebhookRow, session_scope, utcnow
from baton.webhooks import events
from baton.webhooks.subscriptions import FINAL

log = logging.getLogger("baton.webhooks")

#: The Temporal name of the delivery workflow (workflows.webhooks), started by name here:
#: activities never import workflows.
WORKFLOW = "WebhookDelivery"
#: A delivery row still missing this long after its workflow started was rolled back with
#: the change it announced: the workflow ends without sending anything.
ABANDON_AFTER = timedelta(minutes=5)
#: How long (seconds) an attempt looks again for a row not visible yet, and how often.
COMMIT_WAIT_S = 2.0
COMMIT_POLL_S = 0.05
#: Longest a committing transaction waits for Temporal to take its deliveries (seconds).
START_TIMEOUT_S = 30.0
USER_AGENT = "Baton-Webhooks/1"
#: Characters of a receiver's answer kept in the log.
ERROR_CHARS = 300


def _error(text: str) -> str:
    return " ".join(text.split())[:ERROR_CHARS]


async def start_deliveries(
    client: Client, ids: list[str], *, task_queue: str, config: DeliveryConfig
) -> None:
    """Start the ``WebhookDelivery`` workflow of each delivery id on ``task_queue``; one that
    exists (running or done) is left as it is. Raises what Temporal raises otherwise."""
    queued = datetime.now(UTC)

    async def one(delivery_id: str) -> None:
        # One that exists (delivered or failed already) stays: once is the point.
        with contextlib.suppress(WorkflowAlreadyStartedError):
            await client.start_workflow(
                WORKFLOW,
                DeliveryInput(delivery_id=delivery_id, queued_at=queued, config=config),
                id=delivery_id,
                task_queue=task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                static_summary=f"webhook delivery {delivery_id}",
            )

    await asyncio.gather(*(one(i) for i in ids))


class DeliveryStarter:
    """The :data:`baton.webhooks.events.Starter` of one process: starts deliveries on its
    event loop ``loop`` with ``client()``, blocking the committing thread until Temporal has
    them. ``task_queue``: the queue to start on; None = the running activity's (a worker).

    A commit on the loop's own thread cannot wait for the loop: its deliveries are started
    by a task instead (no path of Baton's commits there; the log says if one does).
    """

    def __init__(
        self,
        client: Callable[[], Awaitable[Client]],
        *,
        loop: asyncio.AbstractEventLoop,
        config: DeliveryConfig,
        task_queue: str | None = None,
    ) -> None:
        self._client = client
        self._loop = loop
        self._config = config
        self._task_queue = task_queue
        self._loop_thread = threading.get_ident()

    def install(self, engine: Engine) -> None:
        """Start the deliveries written through ``engine`` in this process."""
        events.register_starter(engine, self, base_url=self._config.public_url)

    async def _start(self, ids: list[str], task_queue: str) -> None:
        await start_deliveries(
            await self._client(), ids, task_queue=task_queue, config=self._config
        )

    def __call__(self, ids: list[str]) -> None:
        task_queue = self._task_queue
        if task_queue is None:
            task_queue = activity.info().task_queue  # raises outside an activity
        if threading.get_ident() == self._loop_thread:
            log.warning("webhook deliveries %s committed on the event loop: started late", ids)
            self._loop.create_task(self._start(ids, task_queue))
            return
        future = asyncio.run_coroutine_threadsafe(self._start(ids, task_queue), self._loop)
        future.result(timeout=START_TIMEOUT_S)


class WebhookActivities:
    """``deliver_webhook`` and ``fail_delivery``, built with the DB engine, the Temporal
    client, the outbound rule (``Settings.outbound_policy``: in auth mode, where receivers
    may be reached) and the delivery settings (``Settings.webhook_config``). Built inside
    the worker's event loop, it also installs the worker's :class:`DeliveryStarter`."""

    def __init__(
        self,
        engine: Engine,
        client: Client,
        *,
        outbound: OutboundPolicy = OPEN,
        config: DeliveryConfig | None = None,
    ) -> None:
        self._engine = engine
        self._policy = outbound
        self._config = config or DeliveryConfig()

        async def same_client() -> Client:
            return client

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # built outside a loop: nothing here can start a workflow
            log.warning("webhook activities built outside an event loop: no delivery starter")
            return
        DeliveryStarter(same_client, loop=loop, config=self._config).install(engine)

    @activity.defn(name="deliver_webhook")
    async def deliver_webhook(self, inp: DeliveryInput) -> str:
        """One signed POST of the delivery; returns its final status (``delivered``, or the
        status it already had). A failed attempt raises a retryable ApplicationError
        (``webhook_attempt_failed``) until the ``max_attempts``-th, which is non-retryable
        and logged ``failed``; a receiver address the outbound rule refuses at connection
        time ends it ``refused`` (``webhook_url_refused``, non-retryable); a deleted
        subscription ends it ``cancelled``."""
        attempt = activity.info().attempt
        # The workflow starts just before the event's transaction commits, so a first
        # attempt may look before the row is visible: look again briefly rather than
        # wait for Temporal's first retry.
        for _ in range(int(COMMIT_WAIT_S / COMMIT_POLL_S)):
            begun = await asyncio.to_thread(self._begin, inp, attempt)
            if begun is not None:
                break
            activity.heartbeat()
            await asyncio.sleep(COMMIT_POLL_S)
        else:
            begun = await asyncio.to_thread(self._begin, inp, attempt, missing_raises=True)
        assert begun is not None
        if isinstance(begun, str):
            return begun
        url, secret, body = begun
        headers = events.sign(secret, inp.delivery_id, datetime.now(UTC), body)
        headers |= {"content-type": "application/json", "user-agent": USER_AGENT}
        code: int | None = None
        try:
            async with (
                heartbeating(),
                asyncio.timeout(inp.config.timeout_s),  # the whole exchange, not each read
                http_client(self._policy, timeout=inp.config.timeout_s) as http,
                http.stream("POST", url, content=body.encode(), headers=headers) as answer,
            ):
                code = answer.status_code
                if 200 <= code < 300:
                    error = None
                else:  # a glimpse of the answer: a receiver's body is never read whole
                    head = b""
                    async for chunk in answer.aiter_bytes():
                        head += chunk
                        if len(head) >= ERROR_CHARS:
                            break
                    error = _error(f"HTTP {code}: {head.decode(errors='replace')}")
            if error is None:
                await asyncio.to_thread(self._end, inp.delivery_id, "delivered", None, code)
                return "delivered"
        except OutboundRefused as exc:
            await asyncio.to_thread(self._end, inp.delivery_id, "refused", str(exc), None)
            raise ApplicationError(
                str(exc), type="webhook_url_refused", non_retryable=True
            ) from exc
        except (httpx2.HTTPError, OSError, TimeoutError) as exc:
            error = _error(f"{type(exc).__name__}: {exc}") or type(exc).__name__
        last = attempt >= inp.config.max_attempts
        await asyncio.to_thread(
            self._end, inp.delivery_id, "failed" if last else "retrying", error, code
        )
        raise ApplicationError(
            f"attempt {attempt}: {error}", type="webhook_attempt_failed", non_retryable=last
        )

    def _begin(
        self, inp: DeliveryInput, attempt: int, *, missing_raises: bool = False
    ) -> tuple[str, str, str] | str | None:
        """Mark the attempt begun: ``(url, secret, body)`` to send, a final status (nothing
        to send), or None while the row is not visible yet (raises with ``missing_raises``)."""
        with session_scope(self._engine) as s:
            row = s.get(WebhookDeliveryRow, inp.delivery_id)
            if row is None and not missing_raises:
                return None
            if row is None:
                waited = datetime.now(UTC) - inp.queued_at
                msg = f"delivery {inp.delivery_id} is not recorded (after {waited})"
                # The transaction that wrote it may still be committing; past ABANDON_AFTER
                # it rolled back, and there is nothing to announce.
                raise ApplicationError(
                    msg, type="delivery_not_recorded", non_retryable=waited > ABANDON_AFTER
                )
            if row.status in FINAL:
                return row.status
            hook = s.get(WebhookRow, row.webhook_id)
            if hook is None:
                row.status = "cancelled"
                row.last_error = "the webhook was deleted"
                s.add(row)
                return row.status
            row.status = "delivering"
            row.attempts = max(row.attempts, attempt)
            row.last_attempt_at = utcnow()
            s.add(row)
            return hook.url, hook.secret, row.payload

    def _end(self, delivery_id: str, status: str, error: str | None, code: int | None) -> None:
        with session_scope(self._engine) as s:
            row = s.get(WebhookDeliveryRow, delivery_id)
            if row is None or row.status in FINAL:
                return
            row.status = status
            row.last_error = error
            row.last_status_code = code
            if status == "delivered":
                row.delivered_at = utcnow()
            s.add(row)

    @activity.defn(name="fail_delivery")
    def fail_delivery(self, inp: DeliveryFailure) -> None:
        """Log a delivery that will not be attempted again as ``failed`` (an attempt that
        timed out last leaves it ``delivering``); a final status stays."""
        self._end(inp.delivery_id, "failed", _error(inp.error), None)
