"""Request and response shapes of the agent registry (docs/api.md), shared by API and CLI."""

from __future__ import annotations

from datetime import datetime
from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from baton.agents.spec import AgentSpec, SafeText, Slug

#: Versions fit a PostgreSQL integer with room to spare (and a 9-digit `slug@N`).
MAX_VERSION = 999_999_999
#: Largest list offset accepted (fits every backend's integer).
MAX_OFFSET = 2_000_000_000

T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    """A list response: ``{"data": [...], "count": N}``; ``count`` is the total before paging."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"data": [], "count": 0}]})

    data: list[T]
    count: int = Field(ge=0, description="Total matching items, before limit/offset.")


class AgentCreate(BaseModel):
    """``POST /v1/agents``: a new identity and its first draft."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "slug": "researcher",
                    "name": "Researcher",
                    "description": "Finds and cites sources.",
                    "spec": {"system_prompt": "You research questions.", "tools": ["web_search"]},
                }
            ]
        },
    )

    slug: Slug
    name: SafeText = Field(min_length=1, max_length=200)
    description: SafeText = Field(default="", max_length=2000)
    spec: AgentSpec = Field(default_factory=AgentSpec)


class AgentUpdate(BaseModel):
    """``PATCH /v1/agents/{slug}``: identity metadata (not versioned)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"name": "Senior researcher"}]}
    )

    name: SafeText | None = Field(default=None, min_length=1, max_length=200)
    description: SafeText | None = Field(default=None, max_length=2000)


class AgentPublic(BaseModel):
    """An agent: identity, draft and where the live pointer is."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "slug": "researcher",
                    "name": "Researcher",
                    "description": "Finds and cites sources.",
                    "live_version": 2,
                    "draft": {"system_prompt": "You research questions."},
                    "retired": False,
                    "created_at": "2026-11-29T12:00:00Z",
                    "updated_at": "2026-11-29T12:05:00Z",
                }
            ]
        }
    )

    slug: str
    name: str
    description: str
    live_version: int | None = Field(description="Revision `slug` resolves to; null = none.")
    draft: AgentSpec
    retired: bool
    created_at: datetime
    updated_at: datetime


class RevisionPublic(BaseModel):
    """An immutable published revision."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "slug": "researcher",
                    "version": 2,
                    "digest": "sha256:9f2c…",
                    "spec": {"system_prompt": "You research questions."},
                    "published_at": "2026-11-29T12:05:00Z",
                }
            ]
        }
    )

    slug: str
    version: int = Field(ge=1)
    digest: str = Field(description="`sha256:` of the canonical JSON of `spec`.")
    spec: AgentSpec
    published_at: datetime


class VersionBody(BaseModel):
    """Body of restore and rollback: ``{"version": 3}``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"version": 1}]})

    version: StrictInt = Field(ge=1, le=MAX_VERSION)
