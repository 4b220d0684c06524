"""What people and agents were granted: users, API tokens and ACL roles (``auth``), and the
stored X-Agent policies with their precedence rule (``policies``).

May import ``baton.storage`` and the foundation modules.
"""
