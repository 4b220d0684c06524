"""Pydantic models and values that cross the Temporal boundary, one module per boundary:

- :mod:`baton.contracts.workflow_io`: workflow inputs and outputs, Signal and Update arguments;
- :mod:`baton.contracts.activity_io`: activity inputs and results;
- :mod:`baton.contracts.values`: value types both sides share (resolved agent, team, usage);
- :mod:`baton.contracts.tool_args`: the arguments of Baton's own tools (X-Agent, delegation);
- :mod:`baton.contracts.codes`: machine-readable error and refusal codes;
- :mod:`baton.contracts.evals`: the answers of the eval endpoints (an eval and its report);
- :mod:`baton.contracts.text`: text checks (slugs, session ids, storable text);
- :mod:`baton.contracts.search`: the search attributes of sessions and steps;
- :mod:`baton.contracts.workspaces`: a workspace file's description and reference.

Sandbox-safe: no I/O, no settings, no SQLModel tables. New fields always have defaults so
histories recorded by older code still decode.

Each name has one home: import it from its module (``from baton.contracts.values import
Via``); the package itself re-exports nothing. The cross-agent guard, a rule rather than a
shape, lives in :mod:`baton.permissions.guard`.
"""
