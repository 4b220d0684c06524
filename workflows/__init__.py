"""Temporal workflow definitions: ``Session`` (``workflows.session``, built from the sections
in ``dispatch``, ``reviews``, ``delegation`` and ``session_base``), ``AgentStep``
(``workflows.step``), ``Inquiry`` (``workflows.inquiry``) and activity option presets
(``workflows.options``). Deterministic code only: no I/O, no settings, no clock.

Layer: below ``worker``. It may import ``activities`` and the domain's pure modules, for
names and types only (inside ``workflow.unsafe.imports_passed_through()``).
"""
