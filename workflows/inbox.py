"""Messages that reach a session while a turn runs (docs/sessions.md, Messages while a turn
runs): each ``send_message`` Update says what it wants by ``if_busy``.

- ``reject`` (the default): refused ``session_busy``, as ever.
- ``enqueue``: the Update is accepted and waits here, in a bounded queue
  (``SessionConfig.max_queued_messages``; one more is refused ``queue_full``), and runs as
  a later turn, in the order the messages were accepted.
- ``interrupt``: the running turn is stopped (its model call cancelled, its open reviews
  withdrawn; a tool or delegation in flight finishes first) and this message runs next,
  ahead of the enqueued ones.

The waiting messages are the Update handlers themselves, so a message is held in the
workflow (never stored before its turn), a repeated message id is one Update (Temporal
deduplicates Updates by id), and the run neither completes idle nor continues-as-new while
one waits (``workflow.all_handlers_finished``). Nothing here issues a command: a session
that only ever gets ``reject`` runs exactly as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from baton.contracts.codes import QUEUE_FULL, SESSION_BUSY, SESSION_CLOSED
    from baton.contracts.workflow_io import TurnOutcome, UserMessage

from workflows.reviews import Reviews


class Inbox:
    """The messages waiting for a session's turn, and the stop of a running turn.

    ``busy``: whether a turn runs (the workflow's); ``closed``: whether the session was
    cancelled (a waiting message then never runs). ``reviews``: the run's reviews, whose
    open ones an interrupt withdraws.
    """

    def __init__(
        self,
        bound: int,
        *,
        busy: Callable[[], bool],
        closed: Callable[[], bool],
        reviews: Reviews,
    ) -> None:
        self._bound = bound
        self._busy = busy
        self._closed = closed
        self._reviews = reviews
        self._tickets = 0
        #: Tickets of the waiting messages, in the order they run (interrupts first).
        self.waiting: list[int] = []
        self._urgent = 0  # interrupts among `waiting`, at its front
        #: The running turn was asked to stop; read by the turn between its steps.
        self.interrupting = False
        self._model_call: workflow.ActivityHandle[Any] | None = None

    def occupied(self) -> bool:
        """A turn runs or a message waits for one: a new message would not run now."""
        return self._busy() or bool(self.waiting)

    def check(self, msg: UserMessage) -> None:
        """The validator's part: refuse what cannot wait (``session_busy``) or has no room
        (``queue_full``); an accepted message's client then waits for its turn."""
        if not self.occupied():
            return
        if msg.if_busy == "reject":
            raise ApplicationError(
                "a turn is already running; wait for it to finish",
                type=SESSION_BUSY,
            )
        if len(self.waiting) >= self._bound:
            raise ApplicationError(
                f"{len(self.waiting)} messages already wait for this session's turn "
                f"(at most {self._bound})",
                type=QUEUE_FULL,
            )

    async def take(
        self, msg: UserMessage, answer: Callable[[UserMessage], Awaitable[TurnOutcome]]
    ) -> TurnOutcome:
        """Run ``msg`` now, or once its turn comes (``enqueue``, ``interrupt``).

        Raises ApplicationError ``session_busy`` / ``queue_full`` (non-retryable) when two
        Updates were validated in one workflow task and this one no longer fits.
        """
        if not self.occupied():
            return await answer(msg)
        try:
            self.check(msg)
        except ApplicationError as err:
            raise ApplicationError(err.message, type=err.type, non_retryable=True) from None
        self._tickets += 1
        ticket = self._tickets
        if msg.if_busy == "interrupt":
            self.waiting.insert(self._urgent, ticket)
            self._urgent += 1
            self.interrupt()
        else:
            self.waiting.append(ticket)
        await workflow.wait_condition(
            lambda: self._closed() or (not self._busy() and self.waiting[0] == ticket)
        )
        self.waiting.remove(ticket)
        if msg.if_busy == "interrupt":
            self._urgent -= 1
        if self._closed():  # cancelled while it waited: no turn runs after the cancel
            raise ApplicationError(
                "the session was cancelled", type=SESSION_CLOSED, non_retryable=True
            )
        self.interrupting = self._urgent > 0  # a later interrupt stops this turn too
        self._reviews.withdraw(self.interrupting)
        return await answer(msg)

    def interrupt(self) -> None:
        """Stop the running turn: cancel its model call and withdraw its open reviews."""
        if not self._busy():
            return
        self.interrupting = True
        if self._model_call is not None and not self._model_call.done():
            self._model_call.cancel()
        self._reviews.withdraw()

    def model_call(self, call: workflow.ActivityHandle[Any] | None) -> None:
        """The running turn's model call (None once it ended): what an interrupt cancels."""
        self._model_call = call
        if call is not None and self.interrupting:
            call.cancel()
