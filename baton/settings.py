"""Baton settings, read from ``BATON_*`` environment variables (and ``.env``).

Nothing is read at import time: call :func:`get_settings` where settings are
needed (app lifespan, CLI entry, worker factory). Secrets never reach a log:
the database URL is rendered with its password hidden in ``repr``.
"""

from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url
from temporalio.envconfig import ClientConfigProfile

from baton import outbound, temporal_ui
from baton.contracts.evals import PublishGate
from baton.contracts.values import DeliveryConfig, ExhibitLimits
from baton.contracts.workflow_io import SessionConfig
from baton.errors import InvalidSettings

DEFAULT_DATABASE_URL = "sqlite:///./.baton/baton.db"
#: Seconds a message refused ``session_busy`` is delivered again while the session's stored
#: status says it is idle (``BATON_MESSAGE_SETTLE_TIMEOUT``).
DEFAULT_MESSAGE_SETTLE_S = 30.0
#: Seconds a workflow task waits on a worker's sticky queue before any worker may take it
#: (``BATON_WORKER_STICKY_TIMEOUT``; the SDK's own default is 10). 4 s keeps the resume of a
#: killed worker's idle sessions within 5 s at p95 (bench/recovery.py --sticky: 4.6-4.7 s;
#: 5.7 s at 5).
DEFAULT_STICKY_TIMEOUT_S = 4.0
#: Shortest accepted BATON_REVIEW_SECRET (characters): 32 random URL-safe characters
#: carry about 190 bits, beyond guessing; shorter values are likely placeholders.
MIN_REVIEW_SECRET = 32
#: Fewest bits of entropy a BATON_REVIEW_SECRET must show (:func:`secret_entropy_bits`).
#: Any secret a generator makes clears it with room (32 random hex characters show ~90
#: bits, `secrets.token_urlsafe(32)` ~190); 32 spaces show 0, `abab…` 32.
MIN_REVIEW_SECRET_BITS = 64
#: Proof key when BATON_REVIEW_SECRET is unset and auth is off. Public on purpose: a
#: proof made with it only tells a decision that came through the API from one typed at
#: the Temporal CLI; it authenticates nobody (outside auth mode nobody is authenticated).
DEV_REVIEW_KEY = b"baton review proofs: public development key, set BATON_REVIEW_SECRET"


def secret_entropy_bits(secret: str) -> float:
    """An upper estimate of the entropy of ``secret`` in bits: its length times the Shannon
    entropy of its characters' frequencies (a string of one repeated character has 0).

    It cannot tell a random secret from a clever placeholder; it refuses the ones that
    carry nothing (blanks, one character repeated, short cycles).
    """
    counts = Counter(secret)
    n = len(secret)
    return sum(c * math.log2(n / c) for c in counts.values())


def check_review_secret(secret: str) -> str:
    """The one rule of a review secret's strength: at least :data:`MIN_REVIEW_SECRET`
    characters and :data:`MIN_REVIEW_SECRET_BITS` bits (:func:`secret_entropy_bits`).
    Returns ``secret``; raises ValueError with one line that never contains it."""
    if len(secret) < MIN_REVIEW_SECRET:
        msg = f"must be at least {MIN_REVIEW_SECRET} characters (it has {len(secret)})"
        raise ValueError(msg)
    bits = secret_entropy_bits(secret)
    if bits < MIN_REVIEW_SECRET_BITS:
        msg = (
            f"carries about {bits:.0f} bits of entropy, fewer than {MIN_REVIEW_SECRET_BITS} "
            "(blanks or repeated characters): generate one, e.g. `python -c 'import "
            "secrets; print(secrets.token_urlsafe(32))'`"
        )
        raise ValueError(msg)
    return secret


def _package_version() -> str:
    """Baton's installed version (the default Worker Versioning build id)."""
    try:
        return version("baton")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


#: BATON_CONTEXT_MESSAGES' default: ~50 turns with tool calls, a few tens of thousands of
#: tokens of ordinary chat, well inside current models' windows.
DEFAULT_CONTEXT_MESSAGES = 200


def _session_default(field: str) -> Any:
    """The default of a setting a session runs with is the :class:`SessionConfig` field's own,
    so each number is written once (in baton.contracts), for settings and workflows alike."""
    return SessionConfig.model_fields[field].default


class Settings(BaseSettings):
    """Process-wide configuration.

    Every field maps to ``BATON_<FIELD>`` (case-insensitive), e.g.
    ``BATON_DATABASE_URL``, ``BATON_REVIEW_TIMEOUT``.

    Raises ``pydantic.ValidationError`` when a value is malformed or when
    ``max_delegation_depth`` exceeds ``runtime_depth_ceiling``.
    """

    model_config = SettingsConfigDict(
        env_prefix="BATON_",
        env_file=".env",
        extra="ignore",
        validate_default=True,
        # A refused value is never echoed: it may be a secret (the review secret, a URL
        # with its password), and a ValidationError reaches logs and tracebacks.
        hide_input_in_errors=True,
    )
    _ui_namespace: str | None = PrivateAttr(default=None)

    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        description="SQLAlchemy URL: sqlite:///path or postgresql+psycopg://user:pw@host/db.",
    )
    temporal_address: str = Field(
        default="localhost:7233",
        description="host:port of the Temporal frontend (`baton dev` and `make demo` run "
        "their own); when set it wins over the Temporal profile, its default only fills "
        "what the profile leaves unset.",
    )
    temporal_namespace: str = Field(
        default="default",
        description="Temporal namespace; the same precedence over the profile as the address.",
    )
    task_queue: str = Field(default="baton", description="Task queue the worker polls.")
    temporal_ui_url: str = Field(
        default="http://localhost:8233", description="Base URL of the Temporal Web UI for links."
    )
    review_timeout: float = Field(
        default=_session_default("review_timeout_s"),
        gt=0,
        le=7 * 86400,
        allow_inf_nan=False,
        description="Seconds a policy review waits for a decision before it is denied "
        "(Gamut X-Agent Policies, 'Review timeout'); read at launch: a running session keeps "
        "its value.",
    )
    review_delivery_grace: float = Field(
        default=_session_default("review_delivery_grace_s"),
        ge=0,
        le=3600,
        allow_inf_nan=False,
        description="Seconds a review's wait stays open past its deadline for a decision the "
        "API received by the deadline whose Signal is delivered late (Temporal or the worker "
        "slow): it still counts; one received past the deadline never does. A review nobody "
        "decides settles timed_out this much later. Read at launch.",
    )
    max_queued_messages: int = Field(
        default=_session_default("max_queued_messages"),
        ge=0,
        le=1000,
        description="Messages sent with if_busy=enqueue or interrupt one session holds while "
        "a turn runs; one more is refused 409 queue_full. Read at launch.",
    )
    eval_concurrency: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Replays one eval runs at once (docs/change-safely.md, Replay against a "
        "candidate); each is a session answering its recorded turns. Read when the eval starts.",
    )
    session_idle_timeout: float = Field(
        default=_session_default("idle_timeout_s"),
        gt=0,
        le=7 * 86400,
        allow_inf_nan=False,
        description="Seconds an idle session's workflow waits for the next message before "
        "it completes; that message starts it again (state in the DB). 600: a conversation "
        "in progress stays warm between messages, one left alone costs the worker nothing.",
    )
    max_delegation_depth: int = Field(
        default=_session_default("max_delegation_depth"),
        ge=1,
        description="How many delegation hops a run may nest (AgentX Agent Teams).",
    )
    runtime_depth_ceiling: int = Field(
        default=_session_default("runtime_depth_ceiling"),
        ge=1,
        description="Per-deployment nesting ceiling no agent setting can raise (Xema Agent "
        "Concepts, 'What bounds a tree'); BATON_MAX_DELEGATION_DEPTH may not exceed it.",
    )
    auth: Literal["off", "on"] = Field(
        default="off", description="'on' requires bearer API tokens and applies agent ACLs."
    )
    allow_adhoc_delegation: bool = Field(
        default=_session_default("allow_adhoc_delegation"),
        description="Offer delegate_to and the roster to ordinary sessions (AgentX Agent "
        "Teams); the roster itself is opt-in per agent.",
    )
    delegation_timeout: float = Field(
        default=_session_default("delegation_timeout_s"),
        gt=0,
        le=86400,
        allow_inf_nan=False,
        description="Seconds one delegation may take before it fails.",
    )
    default_agent: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9-]{0,62}(@[1-9][0-9]{0,8})?$",
        description="Agent a session gets when the request names none (routing default).",
    )
    prices: dict[str, tuple[float, float]] = Field(
        default_factory=dict,
        description='Model prices for metering, USD per million tokens: {"model": [in, out]}; '
        "pydantic-ai's price data wins where it knows the model.",
    )
    max_run_sessions: int = Field(
        default=_session_default("max_run_sessions"),
        ge=1,
        le=100_000,
        description="Sessions one run may start in all (every delegation kind), whatever its "
        "agents' limits say.",
    )
    api_url: str = Field(
        default="http://127.0.0.1:8000",
        description="Where the CLI commands that talk to the API (`baton run`, `trace`, "
        "`reviews`, `step`, `usage`) find it; `--api` overrides it, and an unreachable API "
        "is an error naming the URL and this variable.",
    )
    token: SecretStr | None = Field(
        default=None, description="Bearer API token the CLI sends in auth mode (BATON_TOKEN)."
    )
    model: str | None = Field(
        default=None,
        description="Default model as pydantic-ai names it (e.g. openai:gpt-4o-mini); "
        "unset = the offline scripted model.",
    )
    # review decisions delivered by the API carry a proof (HMAC) keyed
    # with this secret; the worker's settle_review verifies it. Its strength is checked when
    # the settings are read (_strong_review_secret), its presence by review_key().
    review_secret: SecretStr | None = Field(
        default=None,
        description="Key of the proofs on review decisions (HMAC-SHA256), at least "
        f"{MIN_REVIEW_SECRET} characters with {MIN_REVIEW_SECRET_BITS} bits of entropy (no "
        "blanks or repeated characters), the same on every API replica and worker; "
        "required with BATON_AUTH=on. Unset with auth off, a public development key is "
        "used (proofs then only tell API decisions from raw Signals).",
    )
    outbound_allow: str = Field(
        default="",
        max_length=4000,
        description="Networks (CIDRs, comma or space separated, e.g. 127.0.0.1/32,10.0.0.0/8) "
        "a spec's MCP server URLs and webhook receivers may reach in auth mode besides "
        "public addresses; with "
        "BATON_AUTH=on loopback, link-local (cloud metadata), private and other non-public "
        "addresses are refused otherwise, checked on the resolved address.",
    )
    publish_gate: str = Field(
        default="",
        max_length=500,
        description="The publish gate of every agent whose spec sets none "
        "(docs/change-safely.md, 'The publish gate'): JSON or "
        "eval_sessions=10,max_changed=2,max_regressions=0 (max_regressions defaults to 0; "
        "each 0 to 1000, eval_sessions at least 1). Unset = no gate.",
    )
    # the Temporal connection, worker versioning and shutdown.
    temporal_env_config: bool = Field(
        default=True,
        description="Read Temporal's client profile like the `temporal` CLI does "
        "(TEMPORAL_CONFIG_FILE, TEMPORAL_PROFILE, TEMPORAL_ADDRESS, TEMPORAL_API_KEY, "
        "TEMPORAL_TLS_*); an explicit BATON_TEMPORAL_ADDRESS/NAMESPACE still wins.",
    )
    temporal_connect_timeout: float = Field(
        default=10.0,
        gt=0,
        le=300,
        allow_inf_nan=False,
        description="Seconds a connection to Temporal may take before startup fails (one "
        "line, exit 1).",
    )
    # the worker's SIGTERM drain (deploy/ names it: terminationGracePeriodSeconds).
    worker_graceful_shutdown_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        allow_inf_nan=False,
        description="Seconds a stopping worker (SIGTERM) lets in-flight activities finish "
        "before cancelling them (they are retried elsewhere); keep it below the pod's "
        "terminationGracePeriodSeconds.",
    )
    # the worker's memory is this many open runs at most (bench/held.py).
    worker_max_cached_workflows: int = Field(
        default=1000,
        ge=0,
        le=100_000,
        description="Open workflow runs a worker keeps in memory (Temporal's sticky cache; "
        "~240 KB each for a session waiting on a review, bench/README.md). Past it the "
        "least recently used run is evicted: it stays open on the server and its next "
        "task replays its history. 0: no cache, every task replays.",
    )
    worker_sticky_timeout: float = Field(
        default=DEFAULT_STICKY_TIMEOUT_S,
        gt=0,
        le=600,
        allow_inf_nan=False,
        description="Seconds a session's next workflow task waits for the worker that "
        "holds the session in memory (Temporal's sticky queue) before any worker may take "
        "it. A killed worker's sessions wait this long before another worker resumes them "
        "(the SDK's default is 10); a live worker past it replays the history instead.",
    )
    idempotency_ttl: float = Field(
        default=86_400.0,
        ge=60,
        le=30 * 86400,
        allow_inf_nan=False,
        description="Seconds an Idempotency-Key (and the first answer it replays) is kept "
        "after its request; past it the key is purged and may be used again (docs/api.md, "
        "Idempotency).",
    )
    idempotency_lease: float = Field(
        default=15.0,
        ge=0.5,
        le=3600,
        allow_inf_nan=False,
        description="Seconds a request with an Idempotency-Key holds its key without the "
        "API renewing it (renewed every third of it while the request runs). A retry "
        "meanwhile is 409 idempotency_key_in_flight; once a killed API process stops "
        "renewing, a retry on any replica takes the request over.",
    )
    message_settle_timeout: float = Field(
        default=DEFAULT_MESSAGE_SETTLE_S,
        ge=0,
        le=600,
        allow_inf_nan=False,
        description="Seconds the API keeps delivering a message the workflow refuses as "
        "busy while the session's stored status says idle: its last turn has stored its "
        "reply, and the workflow has yet to see it (a worker killed in between leaves that "
        "task on its sticky queue, BATON_WORKER_STICKY_TIMEOUT). Past it: 409 session_busy.",
    )
    worker_deployment: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        pattern=r"^[^\s/]+$",
        description="Worker Versioning deployment name; set = versioned worker (needs "
        "`temporal worker deployment set-current-version`), unset = unversioned.",
    )
    build_id: str = Field(
        default_factory=lambda: _package_version(),
        min_length=1,
        max_length=255,
        pattern=r"^[^\s]+$",
        description="Worker Versioning build id of this worker (default: Baton's version).",
    )
    # how soon a lost worker's work resumes elsewhere (SessionConfig).
    heartbeat_timeout: float = Field(
        default=_session_default("heartbeat_timeout_s"),
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="Seconds without a heartbeat before a model call, tool or delegation of "
        "a lost worker is retried on another; they beat at half of it.",
    )
    model_turn_timeout: float = Field(
        default=_session_default("model_turn_timeout_s"),
        gt=0,
        le=86400,
        allow_inf_nan=False,
        description="Seconds one model call may take (start-to-close).",
    )
    store_timeout: float = Field(
        default=_session_default("store_timeout_s"),
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="Seconds a DB-only activity may take before it is retried (start-to-close).",
    )
    tool_timeout: float = Field(
        default=_session_default("tool_timeout_s"),
        gt=0,
        le=86400,
        allow_inf_nan=False,
        description="Seconds one tool call may take (start-to-close).",
    )
    model_attempts: int = Field(
        default=_session_default("model_attempts"),
        ge=1,
        le=1000,
        description="Attempts one model call may take in all, worker losses included.",
    )
    model_provider_failures: int = Field(
        default=_session_default("model_provider_failures"),
        ge=1,
        le=1000,
        description="Retryable provider errors after which a model call fails for good.",
    )
    # token_budget reservations.
    max_output_tokens: int = Field(
        default=_session_default("max_output_tokens"),
        ge=1,
        le=10_000_000,
        description="Under a token_budget: the most output tokens one model call reserves "
        "(its max_tokens, also capped to what the budget has left).",
    )
    # a turn on a long session reads a bounded window, never the whole transcript.
    context_messages: int = Field(
        default=DEFAULT_CONTEXT_MESSAGES,
        ge=0,
        le=1_000_000,
        description="The context window of a model call: the newest this-many messages of "
        "the session (trimmed to start at a user message), after the agent's system prompt, "
        "which is always sent. 0 = the whole transcript.",
    )
    # --- exhibits (docs/exhibits.md) ---
    exhibit_max_bytes: int = Field(
        default=2 * 1024 * 1024,
        ge=1,
        le=64 * 1024 * 1024,
        description="Largest decoded content of one image or download exhibit (bytes).",
    )
    exhibit_max_inline_chars: int = Field(
        default=64_000,
        ge=1,
        le=1_000_000,
        description="Longest markdown text or chart spec (its JSON) one exhibit shows.",
    )
    exhibit_max_columns: int = Field(
        default=50, ge=1, le=1000, description="Most columns of one table exhibit."
    )
    exhibit_max_rows: int = Field(
        default=500, ge=1, le=100_000, description="Most rows of one table exhibit."
    )
    exhibit_max_cell_chars: int = Field(
        default=2_000, ge=1, le=100_000, description="Longest cell of a table exhibit."
    )
    # --- the ambassador ---
    default_ambassador: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9-]{0,62}(@[1-9][0-9]{0,8})?$",
        description="Ambassador (an agent of kind ambassador) an inquiry gets when it names "
        "none (AgentX Agent Teams, 'the default ambassador profile').",
    )
    inquiry_max_steps: int = Field(
        default=8, ge=1, le=50, description="Model calls one inquiry may make (its step cap)."
    )
    inquiry_timeout: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="Seconds POST /v1/sessions/{id}/inquiries waits for the answer "
        "(504 inquiry_timeout past it).",
    )
    voice_base_url: str | None = Field(
        default=None,
        description="OpenAI-compatible base URL for the ambassador's voice (/audio/speech, "
        "/audio/transcriptions); unset = voice off.",
    )
    voice_api_key: SecretStr | None = Field(default=None, description="Key of the voice provider.")
    voice_tts_model: str = Field(
        default="tts-1", max_length=200, description="Text-to-speech model of the voice."
    )
    voice_stt_model: str = Field(
        default="whisper-1", max_length=200, description="Speech-to-text model of the voice."
    )
    voice_name: str = Field(default="alloy", max_length=100, description="The speaking voice.")
    # the worker's Prometheus endpoint (baton.telemetry).
    metrics_bind: str | None = Field(
        default=None,
        pattern=r"^[^\s:/]*:[0-9]{1,5}$",
        description="host:port where a worker serves Prometheus metrics (the Temporal "
        "SDK's and Baton's counters), e.g. 0.0.0.0:9464; unset = off.",
    )

    # Webhooks (docs/webhooks.md): how deliveries are attempted and where their links point.
    webhook_timeout: float = Field(
        default=10.0, gt=0, le=120, description="Seconds one webhook POST may take."
    )
    webhook_max_attempts: int = Field(
        default=10, ge=1, le=50, description="Attempts of one webhook delivery in all."
    )
    webhook_retry_initial: float = Field(
        default=2.0,
        gt=0,
        le=3600,
        description="Seconds before a webhook's first retry; each next retry waits twice as long.",
    )
    webhook_retry_max: float = Field(
        default=900.0, gt=0, le=86_400, description="Longest wait between two webhook attempts."
    )
    public_url: str | None = Field(
        default=None,
        max_length=500,
        pattern=r"^https?://",
        description="Base URL of the API as a webhook receiver reaches it (the console and "
        "decision links of a payload); unset = BATON_API_URL.",
    )

    # Session workspaces (docs/workspaces.md): where files live and how much they may hold.
    workspace_url: str | None = Field(
        default=None,
        max_length=1000,
        description="Where session workspaces are stored, as an fsspec URL: a local "
        "directory (`/var/lib/baton/workspaces`, `file://…`) or an S3-compatible bucket "
        "(`s3://bucket/prefix`, needs the `s3` extra). Unset: `workspaces/` beside a "
        "SQLite database, else `./.baton/workspaces`.",
    )
    workspace_s3_endpoint: str | None = Field(
        default=None,
        max_length=500,
        pattern=r"^https?://",
        description="Endpoint URL of an S3-compatible service (MinIO, Ceph, R2, …) for an "
        "`s3://` BATON_WORKSPACE_URL; unset = AWS. Credentials come from the standard AWS "
        "variables or credential chain (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, …), "
        "never from Baton's settings.",
    )
    workspace_max_file_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1,
        le=5 * 1024**3,
        description="Largest file a workspace holds (bytes); one byte more is refused "
        "file_too_large.",
    )
    workspace_max_files: int = Field(
        default=1000,
        ge=1,
        le=1_000_000,
        description="Files one workspace holds; a new file past it is refused too_many_files.",
    )
    workspace_quota_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1,
        le=1024**4,
        description="Bytes one workspace holds in all; a write that would pass it is "
        "refused workspace_quota_exceeded.",
    )
    workspace_max_read_bytes: int = Field(
        default=64 * 1024,
        ge=1,
        le=1024 * 1024,
        description="Most bytes one read_file tool call returns to the model (a larger "
        "file is read in parts with offset and length).",
    )
    workspace_refused_types: str = Field(
        default="",
        max_length=4000,
        description="Content types (comma separated, `type/*` allowed) a workspace refuses "
        "to store, e.g. `application/x-msdownload,text/html`; empty = none. Whatever is "
        "stored, active types (HTML, SVG, XML, JavaScript) are never served inline.",
    )

    @field_validator("outbound_allow")
    @classmethod
    def _networks(cls, value: str) -> str:
        outbound.parse_networks(value)  # ValueError naming the bad entry
        return value

    @field_validator("publish_gate")
    @classmethod
    def _gate(cls, value: str) -> str:
        try:
            PublishGate.parse(value)
        except ValueError as exc:
            raise PydanticCustomError(
                "invalid_gate", "not a publish gate: {reason}", {"reason": str(exc)}
            ) from None
        return value

    @field_validator("review_secret")
    @classmethod
    def _strong_review_secret(cls, value: SecretStr | None) -> SecretStr | None:
        # PydanticCustomError: its message is shown as written (one line, no "Value error").
        if value is not None:
            try:
                check_review_secret(value.get_secret_value())
            except ValueError as exc:
                raise PydanticCustomError("weak_secret", "{reason}", {"reason": str(exc)}) from None
        return value

    @model_validator(mode="after")
    def _depth_within_ceiling(self) -> Settings:
        if self.max_delegation_depth > self.runtime_depth_ceiling:
            msg = (
                f"max_delegation_depth ({self.max_delegation_depth}) exceeds "
                f"runtime_depth_ceiling ({self.runtime_depth_ceiling})"
            )
            raise ValueError(msg)
        return self

    def review_key(self) -> bytes:
        """The key of review-decision proofs (docs/xagent.md, "Reviews").

        ``BATON_REVIEW_SECRET`` when set; unset with auth off, the public
        :data:`DEV_REVIEW_KEY` (there is no identity to protect: every API caller
        is ``local``). The API and the worker call this at start so a bad
        configuration stops them there, never mid-review. Raises InvalidSettings
        when auth is on and the secret is unset. A weak secret (shorter than
        :data:`MIN_REVIEW_SECRET` characters, or without :data:`MIN_REVIEW_SECRET_BITS`
        bits of entropy: :func:`check_review_secret`) never gets this far: reading the
        settings refuses it. No message ever contains the secret.
        """
        if self.review_secret is None:
            if self.auth == "on":
                msg = (
                    "BATON_REVIEW_SECRET is required with BATON_AUTH=on (the same value on "
                    "every API replica and worker; e.g. `python -c 'import secrets; "
                    "print(secrets.token_urlsafe(32))'`)"
                )
                raise InvalidSettings(msg)
            return DEV_REVIEW_KEY
        # Its strength was checked when the settings were read (_strong_review_secret).
        return self.review_secret.get_secret_value().encode()

    def outbound_policy(self) -> outbound.OutboundPolicy:
        """Where the worker may connect for a spec's URLs (``mcp_servers``): with auth on,
        public addresses and the ``BATON_OUTBOUND_ALLOW`` networks only; with auth off,
        anywhere (:mod:`baton.outbound`)."""
        return outbound.OutboundPolicy(
            restricted=self.auth == "on", allow=outbound.parse_networks(self.outbound_allow)
        )

    def exhibit_limits(self) -> ExhibitLimits:
        """What one exhibit may hold (``BATON_EXHIBIT_*``), for the worker's activities."""
        return ExhibitLimits(
            max_bytes=self.exhibit_max_bytes,
            max_inline_chars=self.exhibit_max_inline_chars,
            max_columns=self.exhibit_max_columns,
            max_rows=self.exhibit_max_rows,
            max_cell_chars=self.exhibit_max_cell_chars,
        )

    def publish_gate_config(self) -> PublishGate | None:
        """The deployment's publish gate (``BATON_PUBLISH_GATE``), None when unset; a
        malformed one never gets this far (reading the settings refuses it)."""
        return PublishGate.parse(self.publish_gate)

    def webhook_config(self) -> DeliveryConfig:
        """How webhook deliveries are attempted and linked (workflows cannot read settings)."""
        return DeliveryConfig(
            timeout_s=self.webhook_timeout,
            max_attempts=self.webhook_max_attempts,
            retry_initial_s=self.webhook_retry_initial,
            retry_max_s=max(self.webhook_retry_max, self.webhook_retry_initial),
            public_url=(self.public_url or self.api_url).rstrip("/"),
        )

    def session_config(self) -> SessionConfig:
        """The engine settings a new session runs with (workflows cannot read settings)."""
        return SessionConfig(
            default_model=self.model,
            review_timeout_s=self.review_timeout,
            review_delivery_grace_s=self.review_delivery_grace,
            idle_timeout_s=self.session_idle_timeout,
            max_queued_messages=self.max_queued_messages,
            max_delegation_depth=self.max_delegation_depth,
            auth=self.auth == "on",
            allow_adhoc_delegation=self.allow_adhoc_delegation,
            delegation_timeout_s=self.delegation_timeout,
            runtime_depth_ceiling=self.runtime_depth_ceiling,
            prices=self.prices,
            max_run_sessions=self.max_run_sessions,
            heartbeat_timeout_s=self.heartbeat_timeout,
            model_turn_timeout_s=self.model_turn_timeout,
            store_timeout_s=self.store_timeout,
            tool_timeout_s=self.tool_timeout,
            model_attempts=self.model_attempts,
            model_provider_failures=self.model_provider_failures,
            max_output_tokens=self.max_output_tokens,
        )

    def resolve_namespace(self, profile_namespace: str | None) -> str:
        """The namespace Baton works in: an explicitly set ``BATON_TEMPORAL_NAMESPACE``,
        else the Temporal profile's (``profile_namespace``: TEMPORAL_NAMESPACE or the
        profile file), else ``default`` (the one rule: ``worker.factory`` connects with it)."""
        if "temporal_namespace" in self.model_fields_set or not profile_namespace:
            return self.temporal_namespace
        return profile_namespace

    @property
    def ui_namespace(self) -> str:
        """:meth:`resolve_namespace` with the profile read as the clients read it (once per
        Settings). A profile that cannot be read leaves links on BATON_TEMPORAL_NAMESPACE
        (connecting reports the error, not a link)."""
        if self._ui_namespace is None:
            profile: str | None = None
            if self.temporal_env_config:
                try:
                    profile = ClientConfigProfile.load().namespace
                except (OSError, RuntimeError, ValueError):
                    profile = None
            self._ui_namespace = self.resolve_namespace(profile)
        return self._ui_namespace

    def workflow_url(self, workflow_id: str) -> str:
        """Temporal Web UI link to ``workflow_id`` (its latest run) in Baton's namespace,
        under ``BATON_TEMPORAL_UI_URL``."""
        path = temporal_ui.workflow_path(self.ui_namespace, workflow_id)
        return temporal_ui.absolute(self.temporal_ui_url, path)

    def workflows_url(self, query: str) -> str:
        """Temporal Web UI link to the workflow list filtered by visibility ``query``
        (``BatonRoot = "session-…"``) in Baton's namespace."""
        path = temporal_ui.workflows_path(self.ui_namespace, query)
        return temporal_ui.absolute(self.temporal_ui_url, path)

    @property
    def database_url_redacted(self) -> str:
        """The database URL with any password replaced by ``***``."""
        return make_url(self.database_url).render_as_string(hide_password=True)

    def sqlite_path(self) -> Path | None:
        """The file behind a ``sqlite:///`` URL, or None for other databases / in-memory."""
        url = make_url(self.database_url)
        if url.get_backend_name() != "sqlite" or not url.database or url.database == ":memory:":
            return None
        return Path(url.database)

    def __repr_args__(self):  # type: ignore[no-untyped-def]
        # The URL may carry a password: repr/str/logging see the redacted form only.
        for name, value in super().__repr_args__():
            yield name, (self.database_url_redacted if name == "database_url" else value)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Load settings once per process (lazily, on first call)."""
    return Settings()
