"""The worker: the Temporal client and data converter, the Worker with every workflow and
activity (``worker.factory``), and the embedded dev stack (``worker.stack``).

Layer: below ``api`` and ``cli``. It may import ``workflows``, ``activities`` and the
domain; ``worker.stack`` alone imports ``api`` (``baton dev`` serves it in-process).
"""
