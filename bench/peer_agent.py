"""The peer of bench/peer.py: a regular pydantic-ai ``Agent`` made durable by its
``TemporalDurability`` capability (pydantic-ai 2.68's recommended form; ``TemporalAgent`` is
deprecated). Its own module, passed through the workflow sandbox, so the agent is built once
per process rather than once per workflow run: the peer's best case."""

from __future__ import annotations

from pydantic_ai import Agent
from pydantic_ai.durable_exec.temporal import TemporalDurability

#: The model both the peer and Baton call: pydantic-ai's Chat Completions model, pointed at
#: the stub by OPENAI_BASE_URL (set by bench/peer.py before the worker starts).
MODEL = "openai-chat:stub-model"

peer_agent = Agent(MODEL, name="bench_peer", capabilities=[TemporalDurability()])
