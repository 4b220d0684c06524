"""Session workspaces (docs/workspaces.md): the files a session's agent reads and writes.

- :mod:`baton.workspaces.store`: the storage interface (fsspec: a local directory or an
  S3-compatible bucket), the path-confinement rule and the limits check;
- :mod:`baton.workspaces.sharing`: which workspace a delegated session works in;
- :mod:`baton.workspaces.tools`: the built-in tools ``write_file``, ``read_file``,
  ``list_files`` and ``delete_file``.
"""
