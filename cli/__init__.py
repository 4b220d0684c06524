"""The ``baton`` command line (Typer + Rich), one module per noun; ``cli.main`` composes
them into ``app``.

Layer: an entry point. It may import the domain (``baton``) and, inside the commands
that run them, ``worker`` and ``api``; nothing imports ``cli``.
"""

from cli.main import app

__all__ = ["app"]
