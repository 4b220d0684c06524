"""What crosses the Temporal boundary about a session's workspace (docs/workspaces.md):
a file's description and a reference to it, never its contents (claim-check).

A workspace file is named by ``(workspace_id, path)``; an activity that needs its bytes
reads them from the store (:mod:`baton.workspaces.store`).
"""

from __future__ import annotations

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

#: The built-in tools every session's agent is offered on its workspace (its
#: ``blocked_tools`` may withdraw them).
WORKSPACE_TOOLS = ("write_file", "read_file", "list_files", "delete_file")


class FileInfo(BaseModel):
    """One workspace file: ``path`` (normalised, relative to the workspace, ``/``-separated),
    ``size`` in bytes, ``content_type`` (from the file name's extension;
    ``application/octet-stream`` when unknown) and ``modified`` (UTC)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "path": "reports/summary.md",
                    "size": 2048,
                    "content_type": "text/markdown",
                    "modified": "2026-12-02T06:30:00Z",
                }
            ]
        }
    )

    path: str
    size: int = Field(ge=0)
    content_type: str
    modified: AwareDatetime


class FileRef(BaseModel):
    """A reference to a workspace file, what an activity passes instead of its bytes."""

    workspace_id: str
    path: str
