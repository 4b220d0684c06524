"""The bare floor and the peer's workflow for bench/peer.py, in a module of their own: the
workflow sandbox re-imports a workflow's module for every run (as it does
``workflows/session.py`` for Baton), so it holds nothing heavy."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    from pydantic_ai.durable_exec.temporal import PydanticAIWorkflow

    from bench.peer_agent import peer_agent

REPLY = "ok"


@activity.defn(name="bench_noop")
async def noop(prompt: str) -> str:
    """The instant 'turn': no DB, no model."""
    return REPLY


@workflow.defn(name="BenchBareTurn")
class BareTurn:
    """One prompt, one no-op activity, the reply: the floor of a durable turn."""

    @workflow.run
    async def run(self, prompt: str) -> str:
        return await workflow.execute_activity(
            noop, prompt, start_to_close_timeout=timedelta(seconds=60)
        )


@workflow.defn(name="BenchPeerTurn")
class PeerTurn(PydanticAIWorkflow):
    """One prompt, one pydantic-ai agent run (its model request is an activity), the reply."""

    __pydantic_ai_agents__ = (peer_agent,)

    @workflow.run
    async def run(self, prompt: str) -> str:
        result = await peer_agent.run(prompt)
        return str(result.output)
