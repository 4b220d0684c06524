"""Model providers through pydantic-ai's model layer, and the offline scripted model.

A model is named as pydantic-ai names it (``openai:gpt-4o-mini``,
``openai-chat:llama3``, ``anthropic:claude-…``); the agent's ``model`` wins over
``BATON_MODEL``; with neither, the deterministic ``scripted`` model answers from
the agent's ``playbook`` (docs/models.md). ``openai:``/``openai-chat:`` honour
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` as the OpenAI SDK does.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import weakref
from collections.abc import AsyncIterator
from typing import Any

# FunctionModel meters a streamed reply with this estimate: the scripted model counts
# its max_tokens the same way, so the cap holds on the metered usage exactly.
from pydantic_ai._utils import estimate_string_tokens
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, infer_model
from pydantic_ai.models.function import AgentInfo, DeltaToolCall, DeltaToolCalls, FunctionModel

from baton.agents.spec import MAX_PROMPT_CHARS, PATTERN_TIMEOUT_S, PlaybookRule, pattern_matches

SCRIPTED = "scripted"


def model_name(agent_model: str | None, default: str | None) -> str:
    """The model a turn uses: the agent's, else the deployment default, else ``scripted``."""
    return agent_model or default or SCRIPTED


def last_message_text(messages: list[ModelMessage], *, labelled: bool = True) -> str:
    """Text of the newest request: a user prompt, or the tool results.

    ``labelled`` prefixes each tool result with ``<tool>: `` (what playbook
    ``when`` patterns match against); unlabelled is the raw output.
    """
    for message in reversed(messages):
        if not isinstance(message, ModelRequest):
            continue
        texts: list[str] = []
        for part in message.parts:
            if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                texts.append(part.content)
            elif isinstance(part, ToolReturnPart):
                output = part.model_response_str()
                texts.append(f"{part.tool_name}: {output}" if labelled else output)
        if texts:
            return "\n".join(texts)
    return ""


FILL = "{last_message}"


def _fill(value: Any, last: str) -> Any:
    if isinstance(value, str):
        return value.replace(FILL, last)
    if isinstance(value, dict):
        return {k: _fill(v, last) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, last) for v in value]
    return value


def _fills(value: Any) -> int:
    if isinstance(value, str):
        return value.count(FILL)
    if isinstance(value, dict):
        return sum(_fills(v) for v in value.values())
    if isinstance(value, list):
        return sum(_fills(v) for v in value)
    return 0


def fill(value: Any, last: str, *, budget: int) -> Any:
    """``value`` with every ``{last_message}`` replaced by the start of ``last``, so that all
    the fills together put at most ``budget`` characters of ``last`` into it.

    Bounds what the fills expand to, not each fill: a rule repeating ``{last_message}``
    a thousand times gets ``budget // 1000`` characters per fill (so tool
    arguments are never filled past Temporal's payload limit).
    """
    count = _fills(value)
    return _fill(value, last[: budget // count]) if count else value


#: Time all of a playbook's patterns may take for one model call (seconds).
MATCH_BUDGET_S = 0.25
#: How much of the last message ``{last_message}`` puts into one tool call's arguments, all
#: its fills together (a reply's fills together put at most ``MAX_PROMPT_CHARS``).
MAX_ARG_FILL_CHARS = 2_000


def _select(rules: list[PlaybookRule], text: str) -> PlaybookRule | None:
    """The first rule matching ``text`` within :data:`MATCH_BUDGET_S` in total."""
    deadline = time.monotonic() + MATCH_BUDGET_S
    for rule in rules:
        if rule.when is None:
            return rule
        remaining = min(PATTERN_TIMEOUT_S, deadline - time.monotonic())
        if pattern_matches(rule.when, text, timeout=remaining):
            return rule
    return None


def scripted_model(playbook: list[dict[str, Any]] | None, *, agent_slug: str) -> FunctionModel:
    """The offline model: the first playbook rule whose ``when`` matches answers.

    Deterministic: the same transcript always gives the same reply, streamed
    word by word (``chunk_delay_ms`` apart), then the rule's tool calls. With no
    matching rule it answers ``[<slug>] received: <last message>``. ``max_tokens`` in
    the model settings caps the metered output (the reply stops, calls that do not
    fit are dropped), as a provider's does.
    """
    rules = [PlaybookRule.model_validate(r) for r in playbook or []]

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[Any]:
        last = last_message_text(messages)
        raw = last_message_text(messages, labelled=False)
        # Off the event loop: a slow pattern must not stall the worker's other work.
        rule = await asyncio.to_thread(_select, rules, last)
        reply = (
            fill(rule.reply, raw, budget=MAX_PROMPT_CHARS)
            if rule
            else f"[{agent_slug}] received: {last[:500]}"
        )
        reply = (reply or "")[:MAX_PROMPT_CHARS]  # {last_message} may repeat a long message
        delay = (rule.chunk_delay_ms if rule else 0) / 1000
        # max_tokens (a token_budget reservation) caps the reply as a provider would: the
        # output stops there, and tool calls that no longer fit are dropped. Counted the
        # way FunctionModel meters a stream, so the metered output never exceeds it.
        room = (info.model_settings or {}).get("max_tokens")
        said = False
        for word in re.findall(r"\S+\s*", reply or ""):
            if room is not None:
                room -= estimate_string_tokens(word)
                if room < 0:
                    break
            if delay:
                await asyncio.sleep(delay)
            said = True
            yield word
        if room is not None and room < 0:
            if not said:
                yield ""  # a stream must yield something; empty text meters 0 tokens
            return
        if rule and rule.tool_calls:
            step = sum(isinstance(m, ModelResponse) for m in messages)
            calls: DeltaToolCalls = {}
            for i, call in enumerate(rule.tool_calls):
                args = json.dumps(fill(call.args, raw, budget=MAX_ARG_FILL_CHARS))
                if room is not None:
                    room -= estimate_string_tokens(args)
                    if room < 0:
                        break
                calls[i] = DeltaToolCall(
                    name=call.tool, json_args=args, tool_call_id=f"call_{step}_{i}"
                )
            if calls:
                yield calls

    return FunctionModel(stream_function=stream, model_name=f"{SCRIPTED}:{agent_slug}")


def build_model(name: str, *, playbook: list[dict[str, Any]] | None, agent_slug: str) -> Model:
    """A pydantic-ai model for ``name``; ``scripted`` builds :func:`scripted_model`.

    Raises ``pydantic_ai.exceptions.UserError`` for an unknown provider or a
    missing key (callers treat it as non-retryable).
    """
    if name == SCRIPTED:
        return scripted_model(playbook, agent_slug=agent_slug)
    return _provider_model(name)


#: Environment variables a provider reads when its model is built (base URL, key, org).
_PROVIDER_ENV = ("OPENAI_", "ANTHROPIC_")
#: Provider models built in this process, per event loop: their HTTP connection pool
#: belongs to the loop that first used it.
_MODELS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, ...], Model]] = (
    weakref.WeakKeyDictionary()
)


def _provider_model(name: str) -> Model:
    """``infer_model(name)``, built once per event loop and provider environment.

    Building one costs a new SDK client, an HTTP client with a fresh TLS context (~5 ms of
    CPU) and a new connection for every call (bench/README.md); a model holds no
    per-request state, so every turn of this loop shares it. Keyed by the ``OPENAI_*`` /
    ``ANTHROPIC_*`` variables too, so a changed key or base URL builds a new one.
    """
    env = tuple(sorted(f"{k}={v}" for k, v in os.environ.items() if k.startswith(_PROVIDER_ENV)))
    key = (name, *env)
    try:
        per_loop = _MODELS.setdefault(asyncio.get_running_loop(), {})
    except RuntimeError:  # no running loop: nothing to share the pool with
        per_loop = {}
    model = per_loop.get(key)
    if model is not None:
        return model
    try:
        model = infer_model(name)
    except ImportError as exc:  # a provider whose client library is not installed
        msg = f"model '{name}' needs a provider package that is not installed: {exc}"
        raise UserError(msg) from exc
    per_loop[key] = model
    return model
