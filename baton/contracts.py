"""Pydantic models that cross the Temporal boundary (workflow inputs, activity results).

Sandbox-safe: no I/O, no settings, no SQLModel tables. New fields always have
defaults so histories recorded by older code still decode.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ResolvedLimits(BaseModel):
    """Effective limits: the minimum of every value set along the chain; null = unbounded."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"max_depth": 2, "max_spawns": None, "token_budget": 100000}]
        }
    )

    max_depth: int | None = None
    max_spawns: int | None = None
    token_budget: int | None = None


class ResolvedDelegation(BaseModel):
    """Effective ad-hoc delegation settings."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"available_for_delegation": True, "delegation_hint": "writes reports"}]
        }
    )

    available_for_delegation: bool = False
    delegation_hint: str | None = None


class ResolvedNode(BaseModel):
    """A subagent node after resolution: the referenced agent pinned, tools narrowed."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "alias": "checker",
                    "agent": "fact-checker",
                    "version": 2,
                    "system_prompt": "Check claims.",
                    "tools": ["web_search"],
                    "allowed_tools": ["web_search"],
                    "blocked_tools": ["shell"],
                }
            ]
        }
    )

    alias: str
    agent: str = Field(description="Slug of the referenced agent.")
    version: int = Field(description="Revision the reference resolved to.")
    system_prompt: str = ""
    model: str | None = None
    tools: list[str] = Field(default_factory=list, description="Tools this node may use.")
    allowed_tools: list[str] | None = Field(
        default=None, description="Envelope inherited by children; null = no envelope."
    )
    blocked_tools: list[str] = Field(default_factory=list)
    limits: ResolvedLimits = Field(default_factory=ResolvedLimits)
    subagents: list[ResolvedNode] = Field(default_factory=list)


class ResolvedAgent(BaseModel):
    """The effective configuration of one published revision (``GET …/resolved``).

    ``inheritance`` lists the chain as pins, derived first (``["writer@2",
    "base@1"]``). ``tools`` is what the agent may actually use: declared tools
    of the whole chain, inside ``allowed_tools`` (when set), minus ``blocked_tools``.
    """

    model_config = ConfigDict(json_schema_extra={"examples": [{"slug": "writer", "version": 2}]})

    slug: str
    version: int
    digest: str
    name: str = ""
    description: str = ""
    system_prompt: str = ""
    model: str | None = None
    playbook: list[dict[str, Any]] | None = None
    skills: list[str] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    allowed_tools: list[str] | None = None
    blocked_tools: list[str] = Field(default_factory=list)
    limits: ResolvedLimits = Field(default_factory=ResolvedLimits)
    delegation: ResolvedDelegation = Field(default_factory=ResolvedDelegation)
    workspace_sharing: Literal["isolated", "shareable"] = "isolated"
    subagents: list[ResolvedNode] = Field(default_factory=list)
    inheritance: list[str] = Field(default_factory=list)

    @property
    def pin(self) -> str:
        """``slug@version``."""
        return f"{self.slug}@{self.version}"
