"""Session workspaces on an S3 bucket: the store through s3fs against moto's S3 server
(``moto.server.ThreadedMotoServer`` on 127.0.0.1, the real S3 wire protocol over HTTP),
and one end-to-end run on the real stack whose agent writes into the bucket.

Moto stands in for AWS: what these tests prove is that Baton speaks S3 as s3fs and
botocore speak it, not how any one provider behaves. The server starts once per module."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer
from temporalio.testing import WorkflowEnvironment

from baton.settings import Settings
from baton.workspaces.store import (
    ContentTypeRefused,
    FileNotFound,
    FileTooLarge,
    InvalidPath,
    QuotaExceeded,
    TooManyFiles,
    Workspace,
    WorkspaceLimits,
    WorkspaceStore,
)
from tests.conftest import live_stack
from tests.test_e2e_sessions import agent
from worker.stack import free_port

BUCKET = "baton-workspaces"
LIMITS = WorkspaceLimits(max_file_bytes=100, max_files=3, quota_bytes=250, max_read_bytes=8)


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Moto's S3 server on a free loopback port with one bucket, and the AWS variables
    (throwaway credentials, no config files, no instance metadata) pointed at it."""
    home = tmp_path_factory.mktemp("aws")
    with pytest.MonkeyPatch.context() as env:
        for name, value in {
            "AWS_ACCESS_KEY_ID": "baton-test",
            "AWS_SECRET_ACCESS_KEY": "baton-test-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_CONFIG_FILE": str(home / "config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(home / "credentials"),
            "AWS_EC2_METADATA_DISABLED": "true",
        }.items():
            env.setenv(name, value)
        env.delenv("AWS_PROFILE", raising=False)
        env.delenv("AWS_SESSION_TOKEN", raising=False)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            endpoint = f"http://{host}:{port}"
            s3_client(endpoint).create_bucket(Bucket=BUCKET)
            yield endpoint
        finally:
            server.stop()


def s3_client(endpoint: str) -> Any:
    """A boto3 S3 client of the moto server (to look into the bucket beside s3fs)."""
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def s3_store(endpoint: str, prefix: str, limits: WorkspaceLimits = LIMITS) -> WorkspaceStore:
    """A store on ``s3://BUCKET/prefix`` as ``BATON_WORKSPACE_URL`` and
    ``BATON_WORKSPACE_S3_ENDPOINT`` configure one."""
    settings = Settings(
        workspace_url=f"s3://{BUCKET}/{prefix}",
        workspace_s3_endpoint=endpoint,
        workspace_max_file_bytes=limits.max_file_bytes,
        workspace_max_files=limits.max_files,
        workspace_quota_bytes=limits.quota_bytes,
        workspace_max_read_bytes=limits.max_read_bytes,
        workspace_refused_types=",".join(limits.refused_types),
    )
    return WorkspaceStore.from_settings(settings)


@pytest.fixture
def prefix() -> str:
    """A key prefix of its own for each test (the bucket is shared by the module)."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def ws(s3_endpoint: str, prefix: str) -> Workspace:
    """An empty workspace on the bucket with small limits."""
    return s3_store(s3_endpoint, prefix).workspace("session-1")


def keys(endpoint: str, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix/`` in the bucket, read with boto3: ``{key: body}``."""
    client = s3_client(endpoint)
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/").get("Contents", [])
    return {o["Key"]: client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listed}


def test_the_store_on_s3_is_s3fs() -> None:
    """An ``s3://`` URL gives the store s3fs's filesystem, not a local one."""
    store = WorkspaceStore("s3://bucket/prefix", LIMITS, storage_options={"anon": True})
    assert type(store._fs).__module__.startswith("s3fs")
    assert store._root == "bucket/prefix"


def test_write_read_list_delete_round_trip_on_the_bucket(
    ws: Workspace, s3_endpoint: str, prefix: str
) -> None:
    """Bytes come back as written, each file is one object under
    ``<prefix>/<workspace>/``, and a delete removes the object."""
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(50))
    info = ws.write("img/chart.png", png)
    assert (info.path, info.size, info.content_type) == ("img/chart.png", len(png), "image/png")
    ws.write("notes.md", "héllo".encode())
    assert ws.read("img/chart.png") == png
    assert ws.read("notes.md", 1, 3) == "héllo".encode()[1:4]
    assert ws.open("img/chart.png").read() == png
    assert [(f.path, f.size, f.content_type) for f in ws.list()] == [
        ("img/chart.png", len(png), "image/png"),
        ("notes.md", 6, "text/markdown"),
    ]
    assert keys(s3_endpoint, prefix) == {
        f"{prefix}/session-1/img/chart.png": png,
        f"{prefix}/session-1/notes.md": "héllo".encode(),
    }
    ws.delete("img/chart.png")
    assert [f.path for f in ws.list()] == ["notes.md"]
    assert list(keys(s3_endpoint, prefix)) == [f"{prefix}/session-1/notes.md"]


def test_modified_is_the_objects_last_modified_in_utc(ws: Workspace) -> None:
    """A file's ``modified`` is its object's LastModified, a UTC time of the write, the
    same from write, stat and list."""
    before = datetime.now(UTC) - timedelta(seconds=5)
    written = ws.write("a.txt", b"1")
    after = datetime.now(UTC) + timedelta(seconds=5)
    assert written.modified.tzinfo is UTC
    assert before <= written.modified <= after
    assert ws.stat("a.txt").modified == written.modified
    assert ws.list()[0].modified == written.modified


def test_an_empty_or_unknown_workspace_lists_nothing(ws: Workspace, s3_endpoint: str) -> None:
    """A workspace nothing was written to (no key under its prefix) lists no file, and so
    does one on a prefix the bucket has never seen."""
    assert ws.list() == []
    other = s3_store(s3_endpoint, f"never-{uuid.uuid4().hex[:8]}").workspace("session-9")
    assert other.list() == []


def test_a_workspace_lists_only_its_own_keys(s3_endpoint: str, prefix: str) -> None:
    """Workspaces whose ids share a beginning (``session-1``, ``session-10``) list only
    their own files."""
    store = s3_store(s3_endpoint, prefix)
    store.workspace("session-1").write("mine.txt", b"1")
    store.workspace("session-10").write("theirs.txt", b"2")
    store.workspace("session-1x").write("x.txt", b"3")
    assert [f.path for f in store.workspace("session-1").list()] == ["mine.txt"]
    assert [f.path for f in store.workspace("session-10").list()] == ["theirs.txt"]


def test_folders_are_key_prefixes_not_files(ws: Workspace) -> None:
    """S3 has no folders: ``d`` of ``d/x.txt`` is not a file to stat, read or delete, and a
    missing key is ``file_not_found``."""
    ws.write("d/x.txt", b"1")
    for call in (ws.stat, ws.read, ws.delete):
        for path in ("nope.txt", "d"):
            with pytest.raises(FileNotFound):
                call(path)
    assert [f.path for f in ws.list()] == ["d/x.txt"]


def test_a_path_through_a_file_or_onto_a_folder_is_refused(ws: Workspace) -> None:
    """On a bucket too, a file cannot be a folder, nor a folder a file (S3 itself would
    store both keys)."""
    ws.write("a/b.txt", b"1")
    with pytest.raises(InvalidPath):
        ws.write("a", b"1")
    with pytest.raises(InvalidPath):
        ws.write("a/b.txt/c", b"1")


@pytest.mark.parametrize("bad", ["../session-2/x.txt", "a/../../x", "/etc/passwd", "a\\b"])
def test_path_traversal_is_refused_and_writes_nothing(
    ws: Workspace, s3_endpoint: str, prefix: str, bad: str
) -> None:
    """A path leaving the workspace is ``invalid_path`` for every call, and no key is
    written anywhere in the bucket."""
    for call in (ws.stat, ws.read, ws.delete, lambda p: ws.write(p, b"x")):
        with pytest.raises(InvalidPath):
            call(bad)
    assert keys(s3_endpoint, prefix) == {}


def test_keys_no_caller_could_write_are_not_listed(
    ws: Workspace, s3_endpoint: str, prefix: str
) -> None:
    """A key put into the bucket by other means under the workspace's prefix with ``..``
    in it is neither listed nor counted."""
    client = s3_client(s3_endpoint)
    client.put_object(Bucket=BUCKET, Key=f"{prefix}/session-1/a/../../session-2/x", Body=b"1")
    ws.write("ok.txt", b"yes")
    assert [f.path for f in ws.list()] == ["ok.txt"]


def test_file_size_limit_at_its_edge(ws: Workspace, s3_endpoint: str, prefix: str) -> None:
    """A file of max_file_bytes is stored; one byte more is refused and no object put."""
    assert ws.write("edge.bin", b"x" * 100).size == 100
    with pytest.raises(FileTooLarge) as err:
        ws.write("over.bin", b"x" * 101)
    assert err.value.status == 413
    assert list(keys(s3_endpoint, prefix)) == [f"{prefix}/session-1/edge.bin"]


def test_file_count_limit_at_its_edge(ws: Workspace) -> None:
    """The max_files-th file is stored, the next new one refused; replacing one is not new."""
    for i in range(3):
        ws.write(f"f{i}.txt", b"1")
    with pytest.raises(TooManyFiles):
        ws.write("f3.txt", b"1")
    ws.write("f0.txt", b"22")
    assert [(f.path, f.size) for f in ws.list()] == [("f0.txt", 2), ("f1.txt", 1), ("f2.txt", 1)]


def test_quota_at_its_edge_counts_a_replaced_file_once(ws: Workspace) -> None:
    """Files adding up to quota_bytes are stored; one byte past it is refused and changes
    nothing; a replaced file's old size no longer counts."""
    ws.write("a.bin", b"x" * 100)
    ws.write("b.bin", b"x" * 100)
    assert ws.write("c.bin", b"x" * 50).size == 50  # 250: the quota exactly
    with pytest.raises(QuotaExceeded):
        ws.write("c.bin", b"x" * 51)
    assert ws.read("c.bin") == b"x" * 50
    ws.delete("a.bin")
    assert ws.write("c.bin", b"x" * 100).size == 100


def test_refused_content_types_on_the_bucket(s3_endpoint: str, prefix: str) -> None:
    """Refused types (by name or declared) put no object; others are stored."""
    limits = WorkspaceLimits(10, 10, 100, refused_types=("text/html", "application/*"))
    ws = s3_store(s3_endpoint, prefix, limits).workspace("session-2")
    with pytest.raises(ContentTypeRefused):
        ws.write("page.html", b"<p>")
    with pytest.raises(ContentTypeRefused):
        ws.write("data", b"1", "application/x-msdownload")
    assert ws.write("x.txt", b"ok", "text/plain").size == 2
    assert list(keys(s3_endpoint, prefix)) == [f"{prefix}/session-2/x.txt"]


def test_the_objects_carry_the_files_content_type(
    ws: Workspace, s3_endpoint: str, prefix: str
) -> None:
    """Each object is stored with its file's content type (what a presigned URL or the
    bucket's console serves), an unknown extension as application/octet-stream."""
    ws.write("report.md", b"# hi")
    ws.write("chart.png", b"\x89PNG")
    ws.write("blob", b"\x00")
    client = s3_client(s3_endpoint)
    got = {
        name: client.head_object(Bucket=BUCKET, Key=f"{prefix}/session-1/{name}")["ContentType"]
        for name in ("report.md", "chart.png", "blob")
    }
    assert got == {
        "report.md": "text/markdown",
        "chart.png": "image/png",
        "blob": "application/octet-stream",
    }


def test_a_second_process_sees_writes_and_deletes_at_once(s3_endpoint: str, prefix: str) -> None:
    """Two stores on one bucket (the API and a worker: two processes, two s3fs clients)
    see each other's writes, replacements and deletes at once: no listing is cached."""
    api = s3_store(s3_endpoint, prefix).workspace("session-1")
    worker_store = WorkspaceStore(
        f"s3://{BUCKET}/{prefix}",
        LIMITS,
        storage_options={"endpoint_url": s3_endpoint, "skip_instance_cache": True},
    )
    worker = worker_store.workspace("session-1")
    assert api.list() == []
    worker.write("a.txt", b"1")
    assert [f.path for f in api.list()] == ["a.txt"]
    worker.write("a.txt", b"22")
    worker.write("b.txt", b"3")
    assert [(f.path, f.size) for f in api.list()] == [("a.txt", 2), ("b.txt", 1)]
    assert api.stat("a.txt").size == 2 and api.read("a.txt") == b"22"
    worker.delete("a.txt")
    with pytest.raises(FileNotFound):
        api.stat("a.txt")
    assert [f.path for f in api.list()] == ["b.txt"]


def test_an_agents_file_lands_in_the_bucket_and_downloads_with_its_type(
    temporal_env: WorkflowEnvironment, tmp_path: Path, s3_endpoint: str, prefix: str
) -> None:
    """On the real stack with BATON_WORKSPACE_URL=s3://…, an agent's write_file puts the
    object in the bucket and the person downloads it from the API with its content type."""
    with live_stack(
        temporal_env,
        tmp_path / "s3.db",
        workspace_url=f"s3://{BUCKET}/{prefix}",
        workspace_s3_endpoint=s3_endpoint,
    ) as api:
        agent(
            api,
            "scribe",
            playbook=[
                {"when": "write_file:", "reply": "Wrote it."},
                {
                    "reply": "Writing.",
                    "tool_calls": [
                        {
                            "tool": "write_file",
                            "args": {"path": "out/report.md", "content": "# Report\n\nall good"},
                        }
                    ],
                },
            ],
        )
        resp = api.post("/v1/sessions", json={"agent": "scribe", "prompt": "go", "sync": True})
        assert resp.status_code == 201, resp.text
        sid = resp.json()["session_id"]
        assert resp.json()["response"] == "Wrote it."

        assert keys(s3_endpoint, prefix) == {
            f"{prefix}/{sid}/out/report.md": b"# Report\n\nall good"
        }
        listed = api.get(f"/v1/sessions/{sid}/files").json()["data"]
        assert [(f["path"], f["size"], f["content_type"]) for f in listed] == [
            ("out/report.md", 18, "text/markdown")
        ]
        got = api.get(f"/v1/sessions/{sid}/files/out/report.md")
        assert got.status_code == 200, got.text
        assert got.content == b"# Report\n\nall good"
        assert got.headers["content-type"].startswith("text/markdown")
        assert got.headers["content-length"] == "18"
        assert got.headers["content-disposition"].startswith('attachment; filename="report.md"')
        missing = api.get(f"/v1/sessions/{sid}/files/out/none.md")
        assert missing.status_code == 404 and missing.json()["code"] == "file_not_found"
