"""Session workspaces on a real local directory: the path rule, each limit at its edge,
the content types, staged writes, the workspace tools' answers, the sharing rule, and who
may read and write a workspace in auth mode (the API alone)."""

from __future__ import annotations

import base64
import json
import os
import uuid
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from baton.agents.tools import ToolError
from baton.contracts.workflow_io import Provenance
from baton.runs import session_store
from baton.storage.db import session_scope
from baton.workspaces.sharing import workspace_of
from baton.workspaces.store import (
    MAX_PATH_CHARS,
    MAX_SEGMENT_BYTES,
    PARTIAL_DIR,
    ContentTypeRefused,
    FileNotFound,
    FileTooLarge,
    InvalidPath,
    QuotaExceeded,
    TooManyFiles,
    Workspace,
    WorkspaceLimits,
    WorkspaceStore,
    confine,
    content_type_of,
    inline_safe,
)
from baton.workspaces.tools import run_workspace_tool, workspace_tools
from tests.test_api_agents import assert_problem
from tests.test_auth import Users, create_agent, grant, registry_auth  # noqa: F401 (fixture)

LIMITS = WorkspaceLimits(max_file_bytes=100, max_files=3, quota_bytes=250, max_read_bytes=8)


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    """An empty workspace of a store under ``tmp_path`` with small limits."""
    return WorkspaceStore(str(tmp_path / "root"), LIMITS).workspace("session-1")


@pytest.mark.parametrize(
    ("given", "clean"),
    [("a.txt", "a.txt"), ("./a//b/./c.md", "a/b/c.md"), ("dir/x y.csv", "dir/x y.csv")],
)
def test_confine_normalises_relative_paths(given: str, clean: str) -> None:
    """Empty and ``.`` segments are dropped; the rest is kept as given."""
    assert confine(given) == clean


@pytest.mark.parametrize(
    "bad",
    ["", ".", "./", "../x", "a/../../b", "a/..", "/etc/passwd", "C:/x", "a\\b", "a\x00b", "a\nb"],
)
def test_confine_refuses_paths_that_leave_or_name_nothing(bad: str) -> None:
    """``..``, absolute paths, drives, backslashes, control characters and empty paths are
    refused ``invalid_path``."""
    with pytest.raises(InvalidPath) as err:
        confine(bad)
    assert err.value.code == "invalid_path" and err.value.status == 422


def test_confine_bounds_path_and_segment_length_at_the_edge() -> None:
    """A path of MAX_PATH_CHARS characters and a segment of MAX_SEGMENT_BYTES bytes pass;
    one more of either is refused."""
    segment = "s" * MAX_SEGMENT_BYTES
    assert confine(segment) == segment
    with pytest.raises(InvalidPath):
        confine(segment + "s")
    long_path = "/".join(["d" * 99] * 5) + "/" + "f" * (MAX_PATH_CHARS - 500)
    assert len(long_path) == MAX_PATH_CHARS and confine(long_path) == long_path
    with pytest.raises(InvalidPath):
        confine(long_path + "f")


def test_a_symlink_leading_out_of_the_workspace_is_refused(ws: Workspace, tmp_path: Path) -> None:
    """A symlink inside the workspace that points outside it is neither read nor listed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("no")
    ws.write("ok.txt", b"yes")
    os.symlink(outside, tmp_path / "root" / "session-1" / "link")
    with pytest.raises(InvalidPath):
        ws.read("link/secret.txt")
    with pytest.raises(InvalidPath):
        ws.write("link/new.txt", b"x")
    assert [f.path for f in ws.list()] == ["ok.txt"]
    assert not (outside / "new.txt").exists()


def test_text_and_binary_round_trip_with_types_from_the_name(ws: Workspace) -> None:
    """Bytes come back as written; the content type follows the extension."""
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(50))
    info = ws.write("img/chart.png", png)
    assert (info.path, info.size, info.content_type) == ("img/chart.png", len(png), "image/png")
    ws.write("notes.md", "héllo".encode())
    assert ws.read("img/chart.png") == png
    assert ws.read("notes.md", 1, 3) == "héllo".encode()[1:4]
    assert [(f.path, f.content_type) for f in ws.list()] == [
        ("img/chart.png", "image/png"),
        ("notes.md", "text/markdown"),
    ]
    assert content_type_of("blob") == "application/octet-stream"
    assert inline_safe("image/png") and not inline_safe("image/svg+xml")
    assert not inline_safe("text/html")


def test_file_size_limit_at_its_edge(ws: Workspace) -> None:
    """A file of max_file_bytes is stored; one byte more is refused and nothing is written."""
    assert ws.write("edge.bin", b"x" * 100).size == 100
    with pytest.raises(FileTooLarge) as err:
        ws.write("over.bin", b"x" * 101)
    assert err.value.status == 413
    assert [f.path for f in ws.list()] == ["edge.bin"]


def test_file_count_limit_at_its_edge(ws: Workspace) -> None:
    """The max_files-th file is stored, the next new one refused; replacing one is not new."""
    for i in range(3):
        ws.write(f"f{i}.txt", b"1")
    with pytest.raises(TooManyFiles) as err:
        ws.write("f3.txt", b"1")
    assert err.value.status == 409
    ws.write("f0.txt", b"22")  # a replacement keeps the count
    assert len(ws.list()) == 3


def test_quota_at_its_edge_counts_a_replaced_file_once(ws: Workspace) -> None:
    """Files adding up to quota_bytes are stored; one byte past it is refused; a replaced
    file's old size no longer counts."""
    ws.write("a.bin", b"x" * 100)
    ws.write("b.bin", b"x" * 100)
    assert ws.write("c.bin", b"x" * 50).size == 50  # 250: the quota exactly
    with pytest.raises(QuotaExceeded):
        ws.write("c.bin", b"x" * 51)  # 251
    assert ws.read("c.bin") == b"x" * 50  # the refused write changed nothing
    ws.delete("a.bin")
    assert ws.write("c.bin", b"x" * 100).size == 100


def test_refused_content_types_are_a_setting(tmp_path: Path) -> None:
    """Types named in refused_types (exactly or as ``type/*``) are refused, by name or as
    declared; others are stored."""
    limits = WorkspaceLimits(10, 10, 100, refused_types=("text/html", "application/*"))
    ws = WorkspaceStore(str(tmp_path), limits).workspace("session-2")
    with pytest.raises(ContentTypeRefused) as err:
        ws.write("page.html", b"<p>")
    assert err.value.status == 415
    with pytest.raises(ContentTypeRefused):
        ws.write("data", b"1", "application/x-msdownload")
    with pytest.raises(ContentTypeRefused):
        ws.write("x.json", b"{}")
    assert ws.write("x.txt", b"ok", "text/plain").size == 2


def test_a_path_through_a_file_or_onto_a_folder_is_refused(ws: Workspace) -> None:
    """A file cannot be a folder, nor a folder a file."""
    ws.write("a/b.txt", b"1")
    with pytest.raises(InvalidPath):
        ws.write("a", b"1")
    with pytest.raises(InvalidPath):
        ws.write("a/b.txt/c", b"1")


def test_writes_are_staged_then_renamed(ws: Workspace, tmp_path: Path) -> None:
    """A local write leaves no staged file behind and nothing in the workspace but the file."""
    ws.write("x.txt", b"data")
    assert os.listdir(tmp_path / "root" / PARTIAL_DIR) == []
    assert os.listdir(tmp_path / "root" / "session-1") == ["x.txt"]


def test_missing_files_and_folders_are_not_found(ws: Workspace) -> None:
    """Stat, read and delete of a missing file (or a folder) are ``file_not_found``."""
    ws.write("d/x.txt", b"1")
    for call in (ws.stat, ws.read, ws.delete):
        for path in ("nope.txt", "d"):
            with pytest.raises(FileNotFound):
                call(path)


def test_workspace_tools_text_binary_and_errors(ws: Workspace) -> None:
    """The tools round-trip text and base64, read in bounded parts, and answer every refusal
    as ``<code>: <why>``."""
    out = json.loads(run_workspace_tool(ws, "write_file", {"path": "n.txt", "content": "hi"}))
    assert out["path"] == "n.txt" and out["size"] == 2
    blob = bytes([0, 255, 1, 254])
    run_workspace_tool(
        ws,
        "write_file",
        {"path": "b.bin", "content": base64.b64encode(blob).decode(), "encoding": "base64"},
    )
    read = json.loads(run_workspace_tool(ws, "read_file", {"path": "b.bin"}))
    assert read["encoding"] == "base64" and base64.b64decode(read["content"]) == blob
    ws.write("long.txt", b"0123456789abc")
    part = json.loads(run_workspace_tool(ws, "read_file", {"path": "long.txt"}))
    assert part["content"] == "01234567" and part["truncated"] is True  # max_read_bytes 8
    rest = json.loads(run_workspace_tool(ws, "read_file", {"path": "long.txt", "offset": 8}))
    assert rest["content"] == "89abc" and rest["truncated"] is False
    listed = json.loads(run_workspace_tool(ws, "list_files", {}))
    assert listed["count"] == 3 and listed["quota_bytes"] == 250
    for args, code in [
        ({"path": "../x", "content": "1"}, "invalid_path"),
        ({"path": "big", "content": "x" * 101}, "file_too_large"),
        ({"path": "x", "content": "***", "encoding": "base64"}, "invalid arguments"),
        ({"path": "x"}, "invalid arguments"),
        ({"path": "x", "content": "1", "mode": "w"}, "invalid arguments"),
    ]:
        with pytest.raises(ToolError, match=f"^{code}"):
            run_workspace_tool(ws, "write_file", args)
    with pytest.raises(ToolError, match=r"^file_not_found"):
        run_workspace_tool(ws, "delete_file", {"path": "gone.txt"})
    assert json.loads(run_workspace_tool(ws, "delete_file", {"path": "n.txt"})) == {
        "deleted": "n.txt"
    }


def test_workspace_tools_offered_narrow_with_blocked_tools() -> None:
    """The four tools are offered unless blocked_tools withdraws them."""
    assert [t[0] for t in workspace_tools([])] == [
        "write_file",
        "read_file",
        "list_files",
        "delete_file",
    ]
    assert [t[0] for t in workspace_tools(["delete_file", "write_file"])] == [
        "read_file",
        "list_files",
    ]


@pytest.mark.parametrize(
    ("kind", "sharing", "shared"),
    [
        ("task", "shareable", True),
        ("delegate_to", "shareable", True),
        ("route", "shareable", True),
        ("mention", "shareable", True),
        ("invoke", "shareable", False),
        ("task", "isolated", False),
        ("delegate_to", "isolated", False),
    ],
)
def test_sharing_rule(kind: str, sharing: str, shared: bool) -> None:
    """A shareable target of a task or delegate_to works in its caller's workspace; an
    isolated one and every invoke_agent session get their own."""
    got = workspace_of(kind=kind, sharing=sharing, caller_workspace="session-root")  # type: ignore[arg-type]
    assert got == ("session-root" if shared else None)


def test_auth_mode_reads_follow_the_session_and_writes_only_its_owner(
    registry_auth: tuple[Users, Engine, Path],  # noqa: F811  (the fixture imported above)
) -> None:
    """With BATON_AUTH=on a viewer of the session's agent lists and downloads its files,
    only the session's owner attaches one (403 workspace_read_only for anyone else), and a
    user without a role on the agent reads nothing (403)."""
    users, engine, _ = registry_auth
    create_agent(users["alice"], "owned")
    grant(engine, "owned", "bob", "viewer")
    sid = "session-" + str(uuid.uuid4())
    with session_scope(engine) as s:
        session_store.create_session(
            s,
            session_id=sid,
            agent_slug="owned",
            agent_version=1,
            provenance=Provenance(created_by_user="alice"),
            name="alice's",
        )
    url = f"/v1/sessions/{sid}/files/notes.txt"
    assert users["alice"].put(url, content=b"mine").status_code == 201
    assert users["bob"].get(url).content == b"mine"
    assert users["bob"].get(f"/v1/sessions/{sid}/files").json()["count"] == 1
    assert_problem(users["bob"].put(url, content=b"theirs"), 403, "workspace_read_only")
    assert_problem(users["carol"].get(url), 403, "forbidden")
    assert_problem(users["carol"].put(url, content=b"x"), 403, "forbidden")
    assert users["alice"].get(url).content == b"mine"
