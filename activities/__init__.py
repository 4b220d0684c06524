"""Temporal activities: every side effect of a run (DB, model calls, tools, delegations,
MCP, inquiries), as methods of classes built with their dependencies; ``outcomes`` stores
a tool call's result once and heartbeats, for all of them.

Layer: below ``workflows``. It may import the domain (``baton``) only.
"""
