"""Baton's domain: what an agent is, who may reach whom, and the records of a run.

It holds no Temporal worker code and imports nothing from ``cli``, ``api``, ``worker``,
``workflows`` or ``activities`` (an import-linter contract in pyproject.toml checks it).
The sub-packages form layers; each may import only the layers below it:

- ``baton.runs`` — sessions' records, the run tree, metering, launching, external
  sessions, inquiries, deliverables.
- ``baton.permissions`` — the one decision for every cross-agent path, and reviews.
- ``baton.providers`` — model providers (pydantic-ai) and voice.
- ``baton.agents`` — the agent spec, the registry (revisions, live pointer), layers of
  ``extends``, teams, the roster, ordinary tools, ``baton apply``.
- ``baton.grants`` — users, API tokens, ACL roles, and stored X-Agent policies.
- ``baton.storage`` — SQLModel tables, the engine, Alembic migrations.
- the foundation modules at this level — ``contracts`` (shapes that cross the Temporal
  boundary, sandbox-safe), ``errors``, ``settings``, ``telemetry``, ``saferegex``,
  ``payloads``, ``temporal_ui`` (links into the Temporal Web UI, pure) — import only
  each other.
"""
