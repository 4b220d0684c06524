"""Model providers through pydantic-ai and the offline scripted model (``models``), and the
ambassador's voice provider (``voice``).

May import ``baton.agents`` (the spec) and the foundation modules.
"""
