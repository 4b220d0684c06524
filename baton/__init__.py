"""Baton: durable multi-agent orchestration on Temporal.

The ``baton`` package is the core domain (settings, persistence, the agent
registry and resolver, errors, CLI). It holds no Temporal worker code; modules
that workflows import are pure and side-effect free (see ``baton.contracts``).
"""
