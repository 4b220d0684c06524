"""Temporal workflow definitions: ``Session`` (``workflows.session``, whose collaborators
are ``turn``, ``dispatch``, ``xagent``, ``reviews``, ``delegation``, ``external``, ``idle``,
``lifecycle`` and ``status``, over ``context`` and ``calls``), ``AgentStep``
(``workflows.step``), ``Inquiry`` (``workflows.inquiry``) and activity option presets
(``workflows.options``). Deterministic code only: no I/O, no settings, no clock.

Layer: below ``worker``. It may import ``activities`` and the domain's pure modules, for
names and types only (inside ``workflow.unsafe.imports_passed_through()``).
"""
