"""Session activities: load the pinned agent, run a model turn, run a tool, record outcomes.

Activity names are explicit and stable (renaming Python code never renames
them; changing one breaks workflows in flight). Blocking DB work runs in sync
activities on the worker's thread pool, or on a dedicated DB pool inside the
async ``model_turn``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from pydantic_ai.direct import model_request_stream
from pydantic_ai.exceptions import ModelAPIError, ModelHTTPError, UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    ModelResponseStreamEvent,
    PartDeltaEvent,
    PartStartEvent,
    SystemPromptPart,
    TextPart,
    TextPartDelta,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import ToolDefinition
from sqlalchemy.engine import Engine
from sqlmodel import Session
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.outcomes import (
    PREVIEW_CHARS,
    call_message,
    cancel_requested,
    cancelled_outcome,
    claimed_args,
    heartbeating,
    heartbeating_thread,
    store_call_result,
    stored_outcome,
)
from baton import telemetry
from baton.agents import registry, roster
from baton.agents.tools import (
    ToolError,
    delegate_to_tool,
    offered_tools,
    present_exhibit_tool,
    run_tool,
    task_tool,
    xagent_tools,
)
from baton.contracts.activity_io import (
    LoadAgentInput,
    ModelTurnInput,
    ModelTurnResult,
    ResumePoint,
    StatusChange,
    ToolInput,
    ToolOutcome,
    TurnFailure,
)
from baton.contracts.codes import BALANCE_EXHAUSTED, LIMIT_EXCEEDED
from baton.contracts.tool_args import (
    CLAIM_CHECKED,
    PRESENT_EXHIBIT,
    claim_checked,
    compact_args,
    compact_exhibit_args,
)
from baton.contracts.values import (
    CLOSED_STATUSES,
    ExhibitLimits,
    McpToolSnapshot,
    ResolvedAgent,
    ToolCall,
    Usage,
    wire_tool_name,
)
from baton.errors import BatonError
from baton.evals import replay
from baton.outbound import OPEN, OutboundPolicy
from baton.payloads import (
    MAX_PAYLOAD_DEPTH,
    MAX_RESULT_BYTES,
    ensure_fits,
    json_bytes,
    nesting_depth,
)
from baton.permissions import reviews
from baton.providers.models import SCRIPTED, build_model, model_name
from baton.runs import exhibits, metering, run_tree, session_store
from baton.runs.session_store import HistoryItem
from baton.settings import DEFAULT_CONTEXT_MESSAGES, Settings
from baton.storage.db import MessageRow, SessionRow, session_scope
from baton.webhooks import events as webhook_events
from baton.workspaces.store import WorkspaceStore
from baton.workspaces.tools import workspace_tools

AGENT_CACHE_SIZE = 4096
T = TypeVar("T")
CHUNK_FLUSH_S = 0.1
#: HTTP statuses worth retrying; any other 4xx is the request's fault and is final.
RETRYABLE_HTTP = frozenset({408, 409, 425, 429})


def to_model_messages(
    system_prompt: str, history: list[HistoryItem], *, wire_names: bool = False
) -> list[ModelMessage]:
    """Rebuild the pydantic-ai conversation from stored messages.

    ``wire_names``: tool names as a real provider was offered them
    (:func:`~baton.contracts.wire_tool_name`); the offline scripted model reads the
    names Baton stores, as its playbooks are written.

    The system prompt is the first part of the first request. Tool calls left
    without a result (an interrupted turn) get a placeholder result so that
    providers accept the history. Error rows are not sent to the model; an attachment
    (a person's upload) is a user part, after the results of the calls open before it.
    """
    out: list[ModelMessage] = []
    named = wire_tool_name if wire_names else str
    pending: list[ModelRequestPart] = [SystemPromptPart(system_prompt)] if system_prompt else []
    open_calls: dict[str, str] = {}

    def close_open_calls() -> None:
        for call_id, name in open_calls.items():
            pending.append(
                ToolReturnPart(
                    name,
                    "(no result: the turn was interrupted)",
                    tool_call_id=call_id,
                    outcome="interrupted",
                )
            )
        open_calls.clear()

    # Attachment notes (a person's upload) wait until no tool call is open, so a call's
    # result still follows it.
    notes: list[str] = []

    def flush_notes() -> None:
        pending.extend(UserPromptPart(n) for n in notes)
        notes.clear()

    for m in history:
        if m.role == "user":
            close_open_calls()
            flush_notes()
            pending.append(UserPromptPart(m.text))
        elif m.role == "attachment":
            notes.append(m.text)
            if not open_calls:
                flush_notes()
        elif m.role == "tool" and m.tool_call_id in open_calls:
            open_calls.pop(m.tool_call_id)
            name = named(m.tool_name or "tool")
            pending.append(
                ToolReturnPart(
                    name,
                    m.text,
                    tool_call_id=m.tool_call_id,
                    outcome="failed" if m.is_error else "success",
                )
            )
            if not open_calls:
                flush_notes()
        elif m.role == "assistant":
            close_open_calls()
            flush_notes()
            if pending:
                out.append(ModelRequest(parts=pending))
                pending = []
            parts: list[ModelResponsePart] = [TextPart(m.text)] if m.text else []
            for call in m.tool_calls or []:
                wire = named(call["name"])  # as the provider was offered it
                args = call["args"]
                if call["name"] == PRESENT_EXHIBIT:  # shown once; its bulk is not re-read
                    args = compact_exhibit_args(args)
                parts.append(ToolCallPart(wire, args, tool_call_id=call["id"]))
                open_calls[call["id"]] = wire
            out.append(ModelResponse(parts=parts))
    close_open_calls()
    flush_notes()
    if pending:
        out.append(ModelRequest(parts=pending))
    return out


def _result_from(row: MessageRow) -> ModelTurnResult:
    return _turn_result(
        row.id,
        row.text,
        # A row stored before results were bounded may carry oversized arguments: fit them.
        workflow_calls([ToolCall.model_validate(c) for c in row.tool_calls or []], row.id),
        Usage.model_validate(row.usage or {}),
    )


def workflow_calls(calls: list[ToolCall], message_id: str) -> list[ToolCall]:
    """The tool calls of reply ``message_id`` as the workflow receives them: a
    ``present_exhibit`` call's arguments claim-checked (the stored reply keeps them
    whole; :func:`~baton.contracts.tool_args.claim_checked`), the rest fitted to the
    payload bound (:func:`fit_tool_calls`)."""
    return fit_tool_calls(
        [c.model_copy(update={"args": claim_checked(c.name, c.args, message_id)}) for c in calls]
    )


def _turn_result(
    message_id: str, text: str, calls: list[ToolCall], usage: Usage
) -> ModelTurnResult:
    """The ``model_turn`` result (claim-check: the text stays in the DB, a preview travels),
    checked against the payload bound before it is returned."""
    result = ModelTurnResult(
        message_id=message_id,
        preview=text[:PREVIEW_CHARS],
        preview_is_full=len(text) <= PREVIEW_CHARS,
        tool_calls=calls,
        usage=usage,
    )
    return ensure_fits(result, what="model reply")


#: Deepest nesting of tool-call arguments carried to the workflow (see baton.payloads).
MAX_ARG_DEPTH = MAX_PAYLOAD_DEPTH
#: What the tool calls of one reply may weigh in all; the rest of the result (ids,
#: preview, usage) is far smaller than the headroom left below MAX_RESULT_BYTES.
MAX_CALLS_BYTES = MAX_RESULT_BYTES - 64 * 1024
UNPARSED = "_unparsed_arguments"


def fit_tool_calls(calls: list[ToolCall]) -> list[ToolCall]:
    """``calls`` with the largest arguments replaced by an error marker until all the calls
    weigh at most :data:`MAX_CALLS_BYTES` (encoded JSON).

    The marker (``{"_unparsed_arguments": "…"}``) fails the tool's argument check, so the
    model reads why and can retry with smaller arguments; the turn is neither failed nor
    retried (it would fail the same way). Order and ids are kept.
    """
    sizes = [json_bytes(c) for c in calls]
    total = sum(sizes)
    fitted = list(calls)
    for i in sorted(range(len(calls)), key=lambda i: sizes[i], reverse=True):
        if total <= MAX_CALLS_BYTES:
            break
        note = (
            f"arguments of {sizes[i]} bytes: one reply's tool calls may carry at most "
            f"{MAX_CALLS_BYTES} bytes in all; send smaller arguments"
        )
        fitted[i] = ToolCall(id=calls[i].id, name=calls[i].name, args={UNPARSED: note})
        total += json_bytes(fitted[i]) - sizes[i]
    return fitted


def _tool_call(part: ToolCallPart) -> ToolCall:
    try:
        args = part.args_as_dict()
    except (ValueError, RecursionError):
        # Malformed JSON from the model: the tool's schema check reports it back to the model.
        args = {UNPARSED: str(part.args)[:2000]}
    if nesting_depth(args) > MAX_ARG_DEPTH:
        args = {UNPARSED: f"arguments nested deeper than {MAX_ARG_DEPTH} levels"}
    return ToolCall(id=part.tool_call_id, name=part.tool_name, args=args)


def _named(call: ToolCall, remote: dict[str, McpToolSnapshot]) -> ToolCall:
    """A call of an MCP tool under its wire name (``github__search``) gets the name Baton
    routes, stores and audits (``github.search``); every other call keeps its name."""
    snap = remote.get(call.name)
    return call if snap is None else call.model_copy(update={"name": snap.qualified})


def estimate_input_tokens(
    messages: list[ModelMessage], params: ModelRequestParameters, model: str
) -> int:
    """A request's input tokens before the provider counts them: its text (prompts, tool
    results, earlier replies and tool-call arguments) and its tool definitions at
    :data:`~baton.runs.metering.CHARS_PER_TOKEN` characters a token, plus
    :data:`~baton.runs.metering.REQUEST_OVERHEAD_TOKENS` for the request itself. The offline
    ``scripted`` model is metered a flat REQUEST_OVERHEAD_TOKENS per request (how
    pydantic-ai's FunctionModel counts a stream), so its estimate is exactly that.

    Used for the token_budget reservation and the balance cut. A tokenizer may count
    more than this: the documented token_budget bound is what calls admitted with this
    estimate used beyond it (docs/teams.md, 'Limits, enforced').
    """
    if model == SCRIPTED:
        return metering.REQUEST_OVERHEAD_TOKENS
    chars = 0
    for message in messages:
        for part in message.parts:
            if isinstance(part, SystemPromptPart | UserPromptPart | TextPart):
                chars += len(part.content) if isinstance(part.content, str) else 0
            elif isinstance(part, ToolReturnPart):
                chars += len(part.model_response_str()) + len(part.tool_name)
            elif isinstance(part, ToolCallPart):
                chars += len(part.args_as_json_str()) + len(part.tool_name)
    for tool in params.function_tools:
        chars += len(tool.name) + len(tool.description or "")
        chars += len(json.dumps(tool.parameters_json_schema, separators=(",", ":")))
    return metering.REQUEST_OVERHEAD_TOKENS + -(-chars // metering.CHARS_PER_TOKEN)


def _over_budget(exc: Exception) -> ApplicationError:
    """A model call refused by the run's token_budget: non-retryable, said to the model's
    caller as ``limit_exceeded: …`` (never a silent cut)."""
    return ApplicationError(f"{LIMIT_EXCEEDED}: {exc}", type=LIMIT_EXCEEDED, non_retryable=True)


#: ApplicationError type of a model call that failed ``provider_failures`` times.
MODEL_PROVIDER_FAILED = "ModelProviderFailed"


def provider_failures(details: Sequence[Any]) -> int:
    """Provider failures counted by earlier attempts of a model call (heartbeat details
    ``(count,)``; anything else counts as none)."""
    if details and isinstance(details[0], int) and not isinstance(details[0], bool):
        return max(details[0], 0)
    return 0


def _classify(exc: Exception) -> Exception:
    """Map a provider error to what Temporal should do with it (docs/sessions.md, retry budget)."""
    if isinstance(exc, ModelHTTPError):
        if exc.status_code >= 500 or exc.status_code in RETRYABLE_HTTP:
            return exc
        return ApplicationError(
            f"the model provider refused the request (HTTP {exc.status_code}): {exc.message}",
            type="ModelRequestRefused",
            non_retryable=True,
        )
    if isinstance(exc, UserError):
        return ApplicationError(
            f"model configuration error: {exc}", type="ModelConfigError", non_retryable=True
        )
    return exc


def _count_provider_failure(exc: Exception, failures: int, limit: int) -> None:
    """A retryable provider failure, the ``failures``-th of this call: the ``limit``-th
    raises the final ``ModelProviderFailed`` (non-retryable, chained to ``exc``); an
    earlier one is recorded in the heartbeat, so the next attempt (any worker) counts on."""
    if failures >= limit:
        raise ApplicationError(
            f"the model provider failed {failures} times for this call: {exc}",
            type=MODEL_PROVIDER_FAILED,
            non_retryable=True,
        ) from exc
    activity.heartbeat(failures)


def reply_usage(
    response: ModelResponse, prices: dict[str, tuple[float, float]], model: str, started: float
) -> Usage:
    """The metered usage of one model reply: its tokens, its cost in USD (pydantic-ai's
    price data, else ``prices`` (USD per million tokens), else None: unpriced) and the
    wall time in ms since ``started`` (``time.monotonic()``)."""
    cost: float | None = None
    with contextlib.suppress(Exception):  # unknown model/provider: no price known
        cost = float(response.cost().total_price)
    if cost is None:
        cost = metering.price_cost(
            prices, model, response.usage.input_tokens, response.usage.output_tokens
        )
    return Usage(
        requests=1,
        input_tokens=response.usage.input_tokens,
        output_tokens=response.usage.output_tokens,
        cost_usd=cost,
        wall_ms=int((time.monotonic() - started) * 1000),
    )


@dataclass
class Offer:
    """What one model call is offered: the tool definitions, the system prompt (with the
    team or roster brief when delegation is offered) and the MCP tools by wire name."""

    params: ModelRequestParameters
    system_prompt: str
    remote: dict[str, McpToolSnapshot]


def offered(
    agent: ResolvedAgent, inp: ModelTurnInput, entries: list[tuple[str, str]], model: str
) -> Offer:
    """The tools and system prompt of one model call of ``agent``: its own tools, the
    X-Agent tools and (a session's turn) the workspace tools it does not block, its MCP
    servers' tools as snapshotted at load, and
    ``delegate_to`` (team specialists, or the ad-hoc roster ``entries``) and ``task``
    (its subagents) when ``inp.delegation`` offers them and the agent does not block them."""
    tools = [(t.name, t.description, t.parameters) for t in offered_tools(agent.tools)]
    tools += xagent_tools(agent.blocked_tools)
    if inp.workspace:
        tools += workspace_tools(agent.blocked_tools)
    tools += present_exhibit_tool(agent.blocked_tools)
    # Providers accept [a-zA-Z0-9_-] names only; the scripted model's playbooks name tools
    # as Baton stores them.
    wire = wire_tool_name if model != SCRIPTED else str
    remote = {wire(t.qualified): t for t in agent.mcp_tools if t.name}
    tools += [(n, t.description, t.input_schema) for n, t in remote.items()]
    system_prompt = agent.system_prompt
    offer = inp.delegation
    if offer is not None and "delegate_to" not in agent.blocked_tools:
        if offer.team is not None:
            # A lead-only team (AgentX Agent Teams allows zero specialists) has nobody to
            # delegate to: no delegate_to (an empty enum is invalid JSON Schema).
            team = [(m.agent_id, m.hint) for m in offer.team.specialists()]
            if team:
                tools.append(delegate_to_tool(team))
                system_prompt = f"{system_prompt}\n\n{roster.team_block(offer.team)}".strip()
        elif entries:
            tools.append(delegate_to_tool(entries))
            system_prompt = f"{system_prompt}\n\n{roster.roster_block(entries)}".strip()
    if offer is not None and offer.task and agent.subagents and "task" not in agent.blocked_tools:
        tools.append(task_tool(agent))
    params = ModelRequestParameters(
        function_tools=[
            ToolDefinition(name=name, description=about, parameters_json_schema=schema)
            for name, about, schema in tools
        ]
    )
    return Offer(params=params, system_prompt=system_prompt, remote=remote)


@dataclass
class _Stream:
    """The state of one reply's stream: text not flushed yet, characters streamed, and
    what the balance cut needs (the model, the input estimate, the balance)."""

    inp: ModelTurnInput
    model: str
    input_estimate: int
    balance: float | None
    attempt: int
    buffer: str = ""
    streamed: int = 0
    #: Everything streamed: kept as the reply if the call is cancelled (an interrupt).
    whole: str = ""
    flushed_at: float = field(default_factory=time.monotonic)


def _add_reply(s: Session, inp: ModelTurnInput, text: str, **extra: Any) -> None:
    """Store the model call's reply as the assistant message its input names (``extra``:
    its tool calls and usage, when the call completed)."""
    session_store.add_message(
        s,
        message_id=inp.assistant_message_id,
        session_id=inp.session_id,
        position=inp.position,
        role="assistant",
        agent_slug=inp.agent_slug,
        text=text,
        **extra,
    )


class SessionActivities:
    """Activities of SessionWorkflow, built with the DB engine by the worker factory."""

    def __init__(
        self,
        engine: Engine,
        *,
        db_threads: int = 16,
        context_messages: int | None = DEFAULT_CONTEXT_MESSAGES,
        outbound: OutboundPolicy = OPEN,
        exhibit_limits: ExhibitLimits | None = None,
        workspaces: WorkspaceStore | None = None,
    ) -> None:
        self._engine = engine
        #: Where a spec's MCP servers may be reached from here (Settings.outbound_policy).
        self._outbound = outbound
        #: What one exhibit may hold (Settings.exhibit_limits).
        self._exhibit_limits = exhibit_limits or ExhibitLimits()
        #: Where a file exhibit's workspace file is looked up (Settings: BATON_WORKSPACE_*).
        self._workspaces = workspaces or WorkspaceStore.from_settings(Settings())
        #: The context window: newest messages a model call reads (None: all).
        self._context_messages = context_messages
        # DB work of async activities gets its own pool: asyncio's default one is tiny
        # (cores + 4) and shared, so concurrent turns queued behind each other.
        self._db = ThreadPoolExecutor(max_workers=db_threads, thread_name_prefix="baton-db")
        self._agents: dict[str, ResolvedAgent] = {}

    async def _in_db(self, fn: Callable[..., T], *args: Any) -> T:
        # The activity's context goes along (as asyncio.to_thread does), so code run here
        # still sees the activity: its metric meter and its trace span.
        ctx = contextvars.copy_context()
        return await asyncio.get_running_loop().run_in_executor(self._db, ctx.run, fn, *args)

    @activity.defn(name="load_agent")
    def load_agent(self, inp: LoadAgentInput) -> ResolvedAgent:
        """Resolve the pin once at launch and snapshot it on the session row.

        Raises a non-retryable ApplicationError (``agent_unavailable``) when the
        pin no longer resolves (retired or deleted since the launch).
        """
        try:
            with session_scope(self._engine) as s:
                row = s.get(SessionRow, inp.session_id)
                if row is not None and row.agent_version == 0 and row.resolved_agent:
                    # A draft (an eval's step replay in the sandbox) has no pin to resolve:
                    # its snapshot was recorded on the row at launch, and runs unchanged.
                    draft = ResolvedAgent.model_validate(row.resolved_agent)
                    self._remember(inp.session_id, draft)
                    return draft
                resolved = registry.resolve_agent(s, ref=inp.agent_pin)
            if resolved.mcp_servers:  # discovered once, outside the transaction
                from activities.mcp_tools import discover_sync

                tools = discover_sync(
                    resolved.mcp_servers,
                    allowed=resolved.allowed_tools,
                    blocked=resolved.blocked_tools,
                    policy=self._outbound,
                )
                resolved = resolved.model_copy(update={"mcp_tools": tools})
            with session_scope(self._engine) as s:
                row = session_store.get_session(s, session_id=inp.session_id)
                row.resolved_agent = resolved.model_dump(mode="json")
                s.add(row)
        except BatonError as exc:
            raise ApplicationError(
                f"{inp.agent_pin} cannot run: {exc.detail}",
                type="agent_unavailable",
                non_retryable=True,
            ) from exc
        # A local activity (workflows/session.py): the first model_turn usually runs on
        # this worker and finds the snapshot here instead of reading and parsing it again
        # (a launch that records the snapshot itself skips load_agent: _prepare reads it).
        self._remember(inp.session_id, resolved)
        return resolved

    def _remember(self, session_id: str, agent: ResolvedAgent) -> None:
        if len(self._agents) >= AGENT_CACHE_SIZE:
            self._agents.pop(next(iter(self._agents)))
        self._agents[session_id] = agent

    def _prepare(
        self, inp: ModelTurnInput
    ) -> tuple[ModelTurnResult | None, Any, Any, list[tuple[str, str]], float | None]:
        with session_scope(self._engine) as s:
            done = session_store.get_message(s, message_id=inp.assistant_message_id)
            if done is not None:
                return _result_from(done), None, None, [], None
            # Refused before the provider is called (Xema Agent Concepts, spend).
            balance = metering.admit_call(s)
            if inp.token_budget is not None and inp.run_root is not None:
                # A cheap early refusal (no lock); _reserve decides under the run's lock.
                try:
                    run_tree.admit_tokens(
                        s,
                        root_session_id=inp.run_root,
                        token_budget=inp.token_budget,
                        excluding=inp.assistant_message_id,
                    )
                except run_tree.BudgetExhausted as exc:
                    raise _over_budget(exc) from exc
            if inp.user_message_id and inp.user_text is not None:
                session_store.add_message(
                    s,
                    message_id=inp.user_message_id,
                    session_id=inp.session_id,
                    position=inp.user_position or inp.position,
                    role="user",
                    agent_slug=inp.agent_slug,
                    text=inp.user_text,
                )
            session_store.set_status(s, session_id=inp.session_id, status="running")
            agent = self._agents.get(inp.session_id)
            if agent is None:
                # A session's snapshot never changes once recorded: parse it once per worker.
                snapshot = session_store.agent_snapshot(s, session_id=inp.session_id)
                agent = ResolvedAgent.model_validate(snapshot)
                self._remember(inp.session_id, agent)
            offer = inp.delegation
            entries = (
                roster.roster(s, exclude=agent.slug) if offer is not None and offer.adhoc else []
            )
            history = session_store.history(
                s, session_id=inp.session_id, last=self._context_messages
            )
            return None, agent, history, entries, balance

    def _reserve(self, inp: ModelTurnInput, input_estimate: int) -> int:
        """Admit the call under the run's token_budget and reserve for it; its max_tokens."""
        assert inp.token_budget is not None and inp.run_root is not None
        try:
            with session_scope(self._engine) as s:
                return run_tree.reserve_tokens(
                    s,
                    root_session_id=inp.run_root,
                    session_id=inp.session_id,
                    message_id=inp.assistant_message_id,
                    token_budget=inp.token_budget,
                    input_estimate=input_estimate,
                    max_output=inp.max_output_tokens,
                )
        except run_tree.BudgetExhausted as exc:
            raise _over_budget(exc) from exc

    @staticmethod
    def _chunk_event(s: Session, inp: ModelTurnInput, text: str, attempt: int) -> None:
        data = {"message_id": inp.assistant_message_id, "text": text, "attempt": attempt}
        session_store.append_event(s, session_id=inp.session_id, type="chunk", data=data)

    def _chunk(self, inp: ModelTurnInput, text: str, attempt: int) -> None:
        with session_scope(self._engine) as s:
            if not session_store.is_closed(s, session_id=inp.session_id):
                self._chunk_event(s, inp, text, attempt)
                run_tree.forward(s, inp.session_id, "chunk", {"content": text})

    def _persist(
        self,
        inp: ModelTurnInput,
        text: str,
        calls: list[ToolCall],
        usage: Usage,
        last_chunk: str,
        attempt: int,
        model: str = "",
    ) -> None:
        """Store the reply (and the stream's last chunk) and meter it, in one transaction."""
        with session_scope(self._engine) as s:
            if session_store.is_closed(s, session_id=inp.session_id):
                return
            metering.record(
                s,
                message_id=inp.assistant_message_id,
                agent=inp.agent_slug,
                session_id=inp.session_id,
                model=model,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cost_usd=usage.cost_usd,  # None: unpriced
            )
            if last_chunk:
                self._chunk_event(s, inp, last_chunk, attempt)
                run_tree.forward(s, inp.session_id, "chunk", {"content": last_chunk})
            for call in calls:
                # A claim-checked call's bulk never rides the stream: an exhibit's event
                # shows it once, a written file is downloaded from the workspace.
                args = compact_args(call.name, call.args)
                run_tree.forward(
                    s,
                    inp.session_id,
                    "tool_call",
                    {"tool": call.name, "tool_call_id": call.id, "arguments": args},
                )
            _add_reply(
                s, inp, text, tool_calls=[c.model_dump() for c in calls] or None, usage=usage
            )
            if not calls:
                session_store.set_status(s, session_id=inp.session_id, status="idle")

    def _keep_partial(self, inp: ModelTurnInput, text: str) -> None:
        """Store the text a cancelled model call streamed as its reply (metered by
        :meth:`_cut`); nothing when it streamed nothing or the session is closed."""
        with session_scope(self._engine) as s:
            if not text or session_store.is_closed(s, session_id=inp.session_id):
                return
            _add_reply(s, inp, text)

    def _cut(
        self,
        inp: ModelTurnInput,
        model: str,
        input_tokens: int,
        chars: int,
        cost: float | None,
        tail: str,
        attempt: int,
    ) -> None:
        """Meter a stream cut (the balance ran out, or the call was cancelled) with estimated
        tokens (``cost`` None: unpriced) and flush its last text."""
        with session_scope(self._engine) as s:
            if tail and not session_store.is_closed(s, session_id=inp.session_id):
                self._chunk_event(s, inp, tail, attempt)
            metering.record(
                s,
                message_id=inp.assistant_message_id,
                agent=inp.agent_slug,
                session_id=inp.session_id,
                model=model,
                input_tokens=input_tokens,
                output_tokens=chars // metering.CHARS_PER_TOKEN,
                cost_usd=cost,
            )

    @activity.defn(name="model_turn")
    async def model_turn(self, inp: ModelTurnInput) -> ModelTurnResult:
        """One model call: load the transcript, stream the reply, persist it once.

        Idempotent on ``assistant_message_id``: a retry after the message was
        stored returns it without calling the model again. Provider retries are
        off (``max_retries=0``); 5xx/429/connection errors are retried by
        Temporal, other 4xx and configuration errors are non-retryable. Retryable
        provider failures are counted in the heartbeat details across attempts;
        the ``provider_failures``-th is final (``ModelProviderFailed``), while an
        attempt lost with its worker counts none. Under a token_budget the call
        first reserves its input estimate + ``max_tokens`` (``limit_exceeded``,
        non-retryable, when there is no room). The balance ceiling refuses the call
        before the provider and cuts its stream (:func:`baton.runs.metering.admit_call`,
        :func:`~baton.runs.metering.stream_cut`; ``balance_exhausted``, non-retryable).
        """
        telemetry.annotate(agent=inp.agent_slug, session=inp.session_id, turn=inp.turn)
        info = activity.info()
        # Provider failures of earlier attempts travel in the heartbeat details; an attempt
        # lost with its worker (heartbeat timeout) adds none.
        failures = provider_failures(info.heartbeat_details)
        async with heartbeating(lambda: (failures,)):
            done, agent, history, entries, balance = await self._in_db(self._prepare, inp)
            if done is not None:
                return done
            assert isinstance(agent, ResolvedAgent)
            name = model_name(agent.model, inp.default_model)
            offer = offered(agent, inp, entries, name)
            started = time.monotonic()
            messages = to_model_messages(offer.system_prompt, history, wire_names=name != SCRIPTED)
            # A stream is cut once its running cost would spend the balance: input tokens
            # estimated from the request, output from the text streamed so far.
            input_estimate = estimate_input_tokens(messages, offer.params, name)
            settings: dict[str, Any] = {"max_retries": 0}
            if inp.token_budget is not None and inp.run_root is not None:
                # What this call may spend is reserved before it starts.
                settings["max_tokens"] = await self._in_db(self._reserve, inp, input_estimate)
            stream = _Stream(inp, name, input_estimate, balance, info.attempt)
            try:
                model = build_model(name, playbook=agent.playbook, agent_slug=agent.slug)
                async with model_request_stream(
                    model,
                    messages,
                    model_settings=cast(ModelSettings, settings),
                    model_request_parameters=offer.params,
                ) as events:
                    async for event in events:
                        await self._on_event(stream, event)
                    response = events.get()
            except asyncio.CancelledError:
                # Only an interrupt keeps what was streamed: an attempt cut off (heartbeat
                # timeout, worker shutdown) is retried, and a partial reply stored under
                # its message id would be taken for the whole one, its tool calls lost.
                if cancel_requested():
                    await self._interrupted(stream)
                raise
            except (ModelAPIError, UserError) as exc:
                mapped = _classify(exc)
                if mapped is not exc:
                    raise mapped from exc
                failures += 1
                _count_provider_failure(exc, failures, inp.provider_failures)
                raise  # retryable as it is; `raise exc from exc` would make it its own cause
            usage = reply_usage(response, inp.prices, name, started)
            return await self._store_reply(stream, response, offer.remote, usage)

    async def _interrupted(self, stream: _Stream) -> None:
        """A newer message interrupted the turn (if_busy=interrupt): what the model wrote
        so far stays in the transcript, metered as a cut stream is (tokens estimated); the
        workflow marks the interruption."""
        inp = stream.inp
        out = stream.streamed // metering.CHARS_PER_TOKEN
        spent = metering.price_cost(inp.prices, stream.model, stream.input_estimate, out)
        await self._record_cut(stream, spent)
        await self._in_db(self._keep_partial, inp, stream.whole)

    async def _record_cut(self, stream: _Stream, spent: float | None) -> None:
        """Meter a stream cut before its reply ended (the balance ran out, or a newer
        message interrupted it): what it streamed so far, at ``spent`` USD."""
        await self._in_db(
            self._cut,
            stream.inp,
            stream.model,
            stream.input_estimate,
            stream.streamed,
            spent,
            stream.buffer,
            stream.attempt,
        )

    async def _store_reply(
        self,
        stream: _Stream,
        response: ModelResponse,
        remote: dict[str, McpToolSnapshot],
        usage: Usage,
    ) -> ModelTurnResult:
        """Persist a whole reply once (its text, its tool calls as the workflow runs them,
        its usage) and return it as the turn's result. The stored reply keeps a
        claim-checked call's whole arguments (an exhibit's, a written file's content)."""
        inp = stream.inp
        text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
        made = [
            _named(_tool_call(p), remote) for p in response.parts if isinstance(p, ToolCallPart)
        ]
        calls = workflow_calls(made, inp.assistant_message_id)
        pairs = zip(made, calls, strict=True)
        stored = [m if m.name in CLAIM_CHECKED else c for m, c in pairs]
        await self._in_db(
            self._persist, inp, text, stored, usage, stream.buffer, stream.attempt, stream.model
        )
        return _turn_result(inp.assistant_message_id, text, calls, usage)

    async def _on_event(self, stream: _Stream, event: ModelResponseStreamEvent) -> None:
        """One event of the reply's stream: buffer its text, cut the stream at the balance
        ceiling (metered, ``balance_exhausted``), flush the buffer every CHUNK_FLUSH_S."""
        delta = ""
        if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
            delta = event.part.content
        elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
            delta = event.delta.content_delta
        stream.buffer += delta
        stream.whole += delta
        stream.streamed += len(delta)
        inp = stream.inp
        if stream.balance is not None and delta:
            spent = metering.stream_cut(
                inp.prices,
                stream.model,
                input_tokens=stream.input_estimate,
                streamed_chars=stream.streamed,
                balance=stream.balance,
            )
            if spent is not None:
                await self._record_cut(stream, spent)
                raise ApplicationError(
                    f"{BALANCE_EXHAUSTED}: the balance ran out during the reply "
                    f"(about ${spent:.4f} of ${stream.balance:.4f}); the stream was cancelled",
                    type=BALANCE_EXHAUSTED,
                    non_retryable=True,
                )
        now = time.monotonic()
        if stream.buffer and now - stream.flushed_at >= CHUNK_FLUSH_S:
            await self._in_db(self._chunk, inp, stream.buffer, stream.attempt)
            stream.buffer, stream.flushed_at = "", now

    @activity.defn(name="run_tool")
    def run_tool(self, inp: ToolInput) -> ToolOutcome:
        """Run an ordinary tool once; bad arguments or failures become a tool error message.
        ``present_exhibit`` (when ``allowed_tools`` holds it) is :meth:`_present_exhibit`.
        An eval's replay answers it from the recording instead
        (:func:`baton.evals.replay.answer_tool`)."""
        with session_scope(self._engine) as s:
            done = stored_outcome(s, inp.message_id)
            if done is not None:
                return done
            answer = replay.answer_tool(
                s, session_id=inp.session_id, name=inp.call.name, args=inp.call.args
            )
            if answer is not None:
                return store_call_result(s, inp, answer.text, ok=answer.ok)
        if inp.call.name == PRESENT_EXHIBIT and PRESENT_EXHIBIT in inp.allowed_tools:
            return self._present_exhibit(inp)
        started = time.monotonic()
        try:
            with heartbeating_thread():
                output, ok = run_tool(inp.call.name, inp.call.args, inp.allowed_tools), True
        except ToolError as exc:
            output, ok = str(exc), False
        except Exception as exc:  # a broken tool must reach the model, not fail the turn
            output, ok = f"tool '{inp.call.name}' failed: {type(exc).__name__}: {exc}", False
        elapsed_ms = int((time.monotonic() - started) * 1000)
        with session_scope(self._engine) as s:
            return store_call_result(s, inp, output, ok=ok, duration_ms=elapsed_ms)

    def _present_exhibit(self, inp: ToolInput) -> ToolOutcome:
        """Show an exhibit (docs/exhibits.md): the call's whole arguments are read from the
        assistant message that stored them (claim-check), checked, and the exhibit, its
        ``exhibit`` event (forwarded to the run's root in a delegation) and the
        ``present_exhibit`` turn are written in one transaction. Arguments that cannot be
        shown are the model's tool error, and nothing else is written."""
        with session_scope(self._engine) as s:
            args = claimed_args(s, inp)
            try:
                built = exhibits.build(args, self._exhibit_limits)
                built = exhibits.of_file(built, s, self._workspaces, inp.session_id)
            except exhibits.ExhibitRefused as exc:
                return store_call_result(s, inp, str(exc), ok=False)
            if session_store.is_closed(s, session_id=inp.session_id):
                return cancelled_outcome(call_message(inp))
            wire = exhibits.record(
                s,
                built,
                session_id=inp.session_id,
                agent_slug=inp.agent_slug,
                message_id=inp.message_id,
            )
            text = exhibits.displayed_text(wire)
            return store_call_result(s, inp, text, ok=True, tool_args={"exhibit": wire})

    @activity.defn(name="record_failure")
    def record_failure(self, inp: TurnFailure) -> None:
        """Store a turn's failure as an ``error`` message; the session becomes ``final_status``."""
        with session_scope(self._engine) as s:
            session_store.add_message(
                s,
                message_id=inp.message_id,
                session_id=inp.session_id,
                position=inp.position,
                role="error",
                agent_slug=inp.agent_slug,
                text=inp.error,
                is_error=True,
            )
            session_store.set_status(s, session_id=inp.session_id, status=inp.final_status)
            # The failed call will never be metered: its token reservation is freed.
            run_tree.release_tokens(s, session_id=inp.session_id)
            # A session that closed, or a turn that failed with a review open (one call of a
            # reply failed for good while another waited): no review is left pending.
            _cancel_reviews(s, inp.session_id, inp.final_status)
            # A turn that failed for good is news whether the session stays idle (the next
            # message may succeed) or closes failed (its agent cannot load).
            webhook_events.session_failed(
                s, inp.session_id, inp.error, failure=inp.message_id, status=inp.final_status
            )

    @activity.defn(name="record_resume")
    def record_resume(self, point: ResumePoint) -> None:
        """Store ``point`` (the input and queue of the session's next run) on its row:
        the run completes idle next and the next message starts the next run from there
        (:func:`baton.runs.launch.deliver_update`). Idempotent; a closed
        session is left alone."""
        with session_scope(self._engine) as s:
            session_store.set_resume_input(s, point=point)

    @activity.defn(name="set_status")
    def set_status(self, inp: StatusChange) -> None:
        """Record a session status change (and its event)."""
        with session_scope(self._engine) as s:
            session_store.set_status(s, session_id=inp.session_id, status=inp.status)
            if inp.status in CLOSED_STATUSES:
                run_tree.release_tokens(s, session_id=inp.session_id)
                _cancel_reviews(s, inp.session_id, inp.status)


def _cancel_reviews(s: Session, session_id: str, status: str) -> None:
    """A session that closed (``status``: cancelled | failed) or whose turn failed (the
    session ``idle`` after it: decided by ``turn failed``) leaves no review pending: each
    becomes cancelled and audited (:func:`baton.permissions.reviews.cancel_pending`)."""
    by = "turn failed" if status not in CLOSED_STATUSES else status
    for row in reviews.cancel_pending(s, session_id=session_id, by=by):
        # The session's own stream has ended; a run root still open hears of it.
        run_tree.forward(s, session_id, "review_resolved", reviews.resolved_event(row))
