"""Request and response shapes of the agent registry (docs/api.md), shared by API and CLI."""

from __future__ import annotations

from datetime import datetime
from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from baton.agents.spec import AgentSpec, SafeText, Slug
from baton.contracts.evals import EVAL_ID_PATTERN

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


class CursorPage(Page[T], Generic[T]):
    """A list paged by cursor: ``{"data": [...], "count": N, "next_cursor": "…"}``."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"data": [], "count": 0, "next_cursor": None}]}
    )

    next_cursor: str | None = Field(
        default=None,
        description="Pass as `cursor` for the next page; null on the last page.",
    )


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


class BasePin(BaseModel):
    """One base in the live revision's pinned ``extends`` chain (docs/agents.md, 'Pinned
    bases')."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"agent": "base", "pinned": 1, "live": 2}]}
    )

    agent: str = Field(description="The base agent's slug.")
    pinned: int = Field(ge=1, description="The revision of it the live revision resolves.")
    live: int | None = Field(
        description="The revision `rebase` would pin now; null = a rebase would no longer "
        "extend this agent (or the chain no longer resolves)."
    )


class AgentPublic(BaseModel):
    """An agent: identity, draft, where the live pointer is and whether its bases moved."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "slug": "researcher",
                    "name": "Researcher",
                    "description": "Finds and cites sources.",
                    "live_version": 2,
                    "draft": {"system_prompt": "You research questions.", "extends": "base"},
                    "retired": False,
                    "bases": [{"agent": "base", "pinned": 1, "live": 2}],
                    "base_update_available": True,
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
    bases: list[BasePin] = Field(
        default_factory=list,
        description="The live revision's `extends` chain, nearest base first: the revision "
        "each resolves to and the one a rebase would pin now.",
    )
    base_update_available: bool = Field(
        default=False,
        description="A base has a newer live revision than the pinned one: "
        "`POST /v1/agents/{slug}/rebase` publishes a revision pinned to it.",
    )
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
                    "spec": {"system_prompt": "You research questions.", "extends": "base"},
                    "extends_pins": ["base@1"],
                    "eval_id": "eval-5f0c9a3e-2b1d-4c8e-9a7f-1d2e3f4a5b6c",
                    "published_at": "2026-11-29T12:05:00Z",
                    "published_by": "alice",
                }
            ]
        }
    )

    slug: str
    version: int = Field(ge=1)
    digest: str = Field(description="`sha256:` of the canonical JSON of `spec`.")
    spec: AgentSpec
    extends_pins: list[str] | None = Field(
        default=None,
        description="The `extends` chain this revision resolves, as pins nearest base first "
        "(`[]`: extends nothing); recorded at publish. null: migrated without a resolvable "
        "chain (follows the live pointers).",
    )
    eval_id: str | None = Field(
        default=None,
        description="The eval this revision passed to be published under a publish gate "
        "(docs/change-safely.md); null when no gate applied.",
    )
    published_at: datetime
    published_by: str | None = Field(
        default=None,
        description="Who published it: the caller's user (`local` with auth off); null when "
        "not recorded (published before this was recorded, or by `baton apply` on the "
        "database directly).",
    )


class PublishBody(BaseModel):
    """Optional body of ``POST /v1/agents/{slug}/publish``: the eval that lets the draft
    pass its publish gate (docs/change-safely.md); without it, the newest completed eval
    of the draft is used."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"eval_id": "eval-5f0c9a3e-2b1d-4c8e-9a7f-1d2e3f4a5b6c"}]},
    )

    eval_id: StrictStr | None = Field(
        default=None, pattern=EVAL_ID_PATTERN, description="An eval's id."
    )


class VersionBody(BaseModel):
    """Body of restore and rollback: ``{"version": 3}``."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"version": 1}]})

    version: StrictInt = Field(ge=1, le=MAX_VERSION)
