"""The workspace store (docs/workspaces.md): one interface over fsspec, a local directory by
default and an S3-compatible bucket in deployment.

A workspace is the directory ``<root>/<workspace_id>/``; a session works in the one
:func:`workspace_for` names. Every path a caller gives passes :func:`confine` (the one
path rule) and every write :func:`check_limits` (the one limits rule) before a byte is
stored; a local write goes to a temporary file that is renamed into place, so a reader
never sees half a file. File contents never cross Temporal: activities pass
:class:`~baton.contracts.workspaces.FileRef` (claim-check).
"""

from __future__ import annotations

import mimetypes
import os
import posixpath
import re
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any, cast

import fsspec
from fsspec.implementations.local import LocalFileSystem
from sqlmodel import Session

from baton.contracts.codes import (
    CONTENT_TYPE_REFUSED,
    FILE_NOT_FOUND,
    FILE_TOO_LARGE,
    INVALID_PATH,
    TOO_MANY_FILES,
    WORKSPACE_QUOTA_EXCEEDED,
)
from baton.contracts.workspaces import FileInfo, FileRef
from baton.errors import BatonError, Conflict, NotFound, SessionNotFound
from baton.settings import Settings
from baton.storage.db import SessionRow

__all__ = [
    "MAX_PATH_CHARS",
    "ContentTypeRefused",
    "FileInfo",
    "FileNotFound",
    "FileRef",
    "FileTooLarge",
    "InvalidPath",
    "QuotaExceeded",
    "TooManyFiles",
    "Workspace",
    "WorkspaceLimits",
    "WorkspaceStore",
    "check_limits",
    "confine",
    "content_type_of",
    "inline_safe",
    "workspace_for",
]

#: Longest path (characters) and longest path segment (UTF-8 bytes) a workspace accepts.
MAX_PATH_CHARS = 512
MAX_SEGMENT_BYTES = 255
#: A workspace id: a session id (``session-<uuid>``) or any name of this shape.
WORKSPACE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")
#: Where local writes are staged before the rename (beside the workspaces, never in one).
PARTIAL_DIR = ".partial"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DRIVE = re.compile(r"^[A-Za-z]:")


class InvalidPath(BatonError):
    """A path that is not a plain relative path inside the workspace (422)."""

    code = INVALID_PATH
    status = 422
    title = "Invalid path"


class FileNotFound(NotFound):
    """No file at that path in the workspace (404)."""

    code = FILE_NOT_FOUND


class FileTooLarge(BatonError):
    """A file over ``BATON_WORKSPACE_MAX_FILE_BYTES`` (413)."""

    code = FILE_TOO_LARGE
    status = 413
    title = "File too large"


class TooManyFiles(Conflict):
    """A new file past ``BATON_WORKSPACE_MAX_FILES`` (409)."""

    code = TOO_MANY_FILES


class QuotaExceeded(Conflict):
    """A write that would take the workspace past ``BATON_WORKSPACE_QUOTA_BYTES`` (409)."""

    code = WORKSPACE_QUOTA_EXCEEDED


class ContentTypeRefused(BatonError):
    """A content type ``BATON_WORKSPACE_REFUSED_TYPES`` refuses (415)."""

    code = CONTENT_TYPE_REFUSED
    status = 415
    title = "Content type refused"


def confine(path: str) -> str:
    """The one path rule of workspaces: ``path`` normalised to a relative, ``/``-separated
    path inside the workspace, or InvalidPath.

    Empty and ``.`` segments are dropped (``./a//b`` is ``a/b``); refused: an empty
    result, a ``..`` segment, an absolute path (``/…``, ``C:…``), a backslash, a control
    character, a path over :data:`MAX_PATH_CHARS` characters or a segment over
    :data:`MAX_SEGMENT_BYTES` bytes. A symlink leading out of a local workspace is refused
    where the path is opened (:meth:`Workspace._locate`).
    """
    if not isinstance(path, str) or not path:
        raise InvalidPath("a path is required")
    if len(path) > MAX_PATH_CHARS:
        raise InvalidPath(f"a path has at most {MAX_PATH_CHARS} characters ({len(path)} given)")
    if _CONTROL.search(path) or "\\" in path:
        raise InvalidPath("a path may not hold control characters or backslashes")
    if path.startswith("/") or _DRIVE.match(path):
        raise InvalidPath("a path is relative to the workspace: no leading / or drive")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidPath("a path may not contain '..': it must stay inside the workspace")
    if not parts:
        raise InvalidPath("a path must name a file")
    long = next((p for p in parts if len(p.encode()) > MAX_SEGMENT_BYTES), None)
    if long is not None:
        raise InvalidPath(f"a path segment has at most {MAX_SEGMENT_BYTES} bytes")
    return "/".join(parts)


_TYPES = mimetypes.MimeTypes()  # Python's own table only: the same on every machine
for _type, _ext in (
    ("text/markdown", ".md"),
    ("text/markdown", ".markdown"),
    ("application/yaml", ".yaml"),
    ("application/yaml", ".yml"),
    ("image/webp", ".webp"),
    ("image/avif", ".avif"),
    ("application/x-ndjson", ".jsonl"),
    ("text/csv", ".csv"),
    ("application/toml", ".toml"),
):
    _TYPES.add_type(_type, _ext)


def content_type_of(path: str) -> str:
    """A file's content type, from its name's extension (Python's own table, the same on
    every machine); ``application/octet-stream`` when the extension is unknown."""
    found, _ = _TYPES.guess_type(path, strict=False)
    return found or "application/octet-stream"


#: Types a browser may be asked to show inline (``?inline=true``): raster images and plain
#: text, which run nothing. Everything else — HTML, SVG, XML, scripts, PDF — is served as
#: an attachment only, with ``nosniff``.
INLINE_TYPES = frozenset(
    {"image/png", "image/jpeg", "image/gif", "image/webp", "image/avif", "text/plain"}
)


def inline_safe(content_type: str) -> bool:
    """Whether a file of ``content_type`` may be shown inline (:data:`INLINE_TYPES`)."""
    return content_type.split(";", 1)[0].strip().lower() in INLINE_TYPES


@dataclass(frozen=True)
class WorkspaceLimits:
    """What one workspace may hold: the largest file and the file count and total bytes,
    the content types it refuses (``type/subtype`` or ``type/*``) and the most bytes one
    ``read_file`` tool call returns."""

    max_file_bytes: int
    max_files: int
    quota_bytes: int
    refused_types: tuple[str, ...] = ()
    max_read_bytes: int = 64 * 1024

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkspaceLimits:
        """The ``BATON_WORKSPACE_*`` limits."""
        refused = [t.strip().lower() for t in settings.workspace_refused_types.split(",")]
        return cls(
            max_file_bytes=settings.workspace_max_file_bytes,
            max_files=settings.workspace_max_files,
            quota_bytes=settings.workspace_quota_bytes,
            refused_types=tuple(t for t in refused if t),
            max_read_bytes=settings.workspace_max_read_bytes,
        )

    def refuses(self, content_type: str) -> bool:
        """Whether ``content_type`` (parameters ignored) is one the workspace refuses."""
        base = content_type.split(";", 1)[0].strip().lower()
        family = base.split("/", 1)[0] + "/*"
        return base in self.refused_types or family in self.refused_types


def check_limits(
    limits: WorkspaceLimits,
    files: list[FileInfo],
    path: str,
    size: int,
    content_type: str | None = None,
) -> None:
    """The one limits rule of workspaces: may a file of ``size`` bytes be written at the
    confined ``path`` of a workspace holding ``files``?

    Raises ContentTypeRefused when the name's type or the declared ``content_type`` is
    refused; FileTooLarge past ``max_file_bytes`` (``size`` equal to it is accepted);
    InvalidPath when the path runs through a file or onto a folder; TooManyFiles when a new
    file would make more than ``max_files``; QuotaExceeded when the workspace would hold
    more than ``quota_bytes`` (a replaced file's old size no longer counts).
    """
    for kind in {content_type_of(path), *([content_type] if content_type else [])}:
        if limits.refuses(kind):
            raise ContentTypeRefused(f"this workspace refuses files of type {kind}")
    if size > limits.max_file_bytes:
        raise FileTooLarge(
            f"{size} bytes: a workspace file has at most {limits.max_file_bytes} bytes"
        )
    replaced = next((f for f in files if f.path == path), None)
    for f in files:
        if f.path.startswith(path + "/"):
            raise InvalidPath(f"'{path}' is a folder (it holds '{f.path}')")
        if path.startswith(f.path + "/"):
            raise InvalidPath(f"'{f.path}' is a file, not a folder")
    if replaced is None and len(files) + 1 > limits.max_files:
        raise TooManyFiles(
            f"the workspace holds {len(files)} files, its most: delete one or replace one"
        )
    total = sum(f.size for f in files) - (replaced.size if replaced else 0) + size
    if total > limits.quota_bytes:
        raise QuotaExceeded(
            f"writing {size} bytes would make the workspace hold {total} bytes, more than "
            f"its quota of {limits.quota_bytes}: delete files first"
        )


def _modified(info: dict[str, Any]) -> datetime:
    """When a file was last written, from an fsspec ``info`` (local: ``mtime``; S3:
    ``LastModified``), in UTC."""
    value = info.get("mtime", info.get("LastModified", info.get("last_modified")))
    if isinstance(value, datetime):  # botocore's LastModified: aware, in the local zone
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    return datetime.now(UTC)


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


class Workspace:
    """One workspace: the files under ``<root>/<id>/`` of a store.

    Methods take paths as a caller gives them (:func:`confine` applies) and raise the
    errors of this module; blocking I/O (call them from threads or sync activities).
    """

    def __init__(
        self, fs: fsspec.AbstractFileSystem, root: str, workspace_id: str, limits: WorkspaceLimits
    ) -> None:
        if not WORKSPACE_ID.match(workspace_id):
            raise InvalidPath(f"'{workspace_id}' is not a workspace id")
        self.id = workspace_id
        self.limits = limits
        self._fs = fs
        self._root = root
        self._base = posixpath.join(root, workspace_id)
        self._local = isinstance(fs, LocalFileSystem)
        self._s3 = "s3" in _protocols(fs)
        self._lock = _lock_of(f"{root}|{workspace_id}")

    def ref(self, path: str) -> FileRef:
        """A reference to the file at ``path`` (claim-check), path confined."""
        return FileRef(workspace_id=self.id, path=confine(path))

    def _locate(self, path: str) -> tuple[str, str]:
        """``(confined path, storage path)``; InvalidPath when a local symlink leads out."""
        clean = confine(path)
        full = posixpath.join(self._base, clean)
        if self._local:
            base = os.path.realpath(self._base)
            if not os.path.realpath(full).startswith(base + os.sep):
                raise InvalidPath(f"'{clean}' leads out of the workspace")
        return clean, full

    def _info(self, clean: str, info: dict[str, Any]) -> FileInfo:
        return FileInfo(
            path=clean,
            size=int(info.get("size") or 0),
            content_type=content_type_of(clean),
            modified=_modified(info),
        )

    def stat(self, path: str) -> FileInfo:
        """The file at ``path``. Raises FileNotFound (also for a folder), InvalidPath."""
        clean, full = self._locate(path)
        try:
            info = self._fs.info(full)
        except FileNotFoundError:
            info = None
        if info is None or info.get("type") != "file":
            raise FileNotFound(f"no file '{clean}' in the workspace")
        return self._info(clean, info)

    def list(self) -> list[FileInfo]:
        """Every file of the workspace, by path (empty when nothing was written yet)."""
        try:
            found = cast(dict[str, dict[str, Any]], self._fs.find(self._base, detail=True))
        except FileNotFoundError:
            return []
        prefix = self._fs._strip_protocol(self._base).rstrip("/") + "/"
        files: list[FileInfo] = []
        for name, info in found.items():
            stripped = self._fs._strip_protocol(name)
            if info.get("type") != "file" or not stripped.startswith(prefix):
                continue
            rel = stripped[len(prefix) :]
            try:
                clean, _ = self._locate(rel)
            except InvalidPath:
                continue  # a name no caller could have written, or a symlink leading out
            files.append(self._info(clean, info))
        return sorted(files, key=lambda f: f.path)

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """The bytes of the file at ``path`` (``length`` bytes from ``offset``, or all).
        Raises FileNotFound, InvalidPath."""
        _, full = self._locate(path)
        self.stat(path)
        end = None if length is None else offset + length
        return cast(bytes, self._fs.cat_file(full, start=offset or None, end=end))

    def open(self, path: str) -> IO[bytes]:
        """The file at ``path`` opened for reading (stream a large file: the API's
        download). Raises FileNotFound, InvalidPath."""
        _, full = self._locate(path)
        self.stat(path)
        return cast(IO[bytes], self._fs.open(full, "rb"))

    def write(self, path: str, data: bytes, content_type: str | None = None) -> FileInfo:
        """Store ``data`` at ``path`` (replacing a file there) and describe it.

        :func:`check_limits` decides first (``content_type``: what the writer declared;
        the stored type is the name's, :func:`content_type_of`), so a refused write stores
        nothing; a local write is staged and renamed into place. Raises InvalidPath,
        ContentTypeRefused, FileTooLarge, TooManyFiles, QuotaExceeded.
        """
        clean, full = self._locate(path)
        with self._lock:  # one writer per workspace in this process: the quota holds here
            check_limits(self.limits, self.list(), clean, len(data), content_type)
            if self._local:
                staged = posixpath.join(self._root, PARTIAL_DIR, uuid.uuid4().hex)
                self._fs.makedirs(posixpath.dirname(staged), exist_ok=True)
                self._fs.makedirs(posixpath.dirname(full), exist_ok=True)
                try:
                    self._fs.pipe_file(staged, data)
                    os.replace(staged, full)
                finally:
                    if os.path.exists(staged):
                        os.remove(staged)
            else:  # an object PUT, whole or not at all; on S3 typed as the API serves it
                typed = {"ContentType": content_type_of(clean)} if self._s3 else {}
                self._fs.pipe_file(full, data, **typed)
        return self.stat(clean)

    def delete(self, path: str) -> None:
        """Delete the file at ``path``. Raises FileNotFound, InvalidPath."""
        _, full = self._locate(path)
        self.stat(path)
        self._fs.rm_file(full)


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _lock_of(key: str) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(key, threading.Lock())


def default_url(settings: Settings) -> str:
    """Where workspaces live: ``BATON_WORKSPACE_URL``, else ``workspaces/`` beside a SQLite
    database, else ``./.baton/workspaces``."""
    if settings.workspace_url:
        return settings.workspace_url
    db = settings.sqlite_path()
    base = db.parent if db is not None else os.path.join(".", ".baton")
    return os.path.abspath(os.path.join(base, "workspaces"))


class WorkspaceStore:
    """Where workspaces live (an fsspec URL and its storage options) and their limits.

    ``url``: a local directory (made at the first write) or ``s3://bucket/prefix``
    (``storage_options`` go to the filesystem, e.g. ``endpoint_url``). Listings are never
    cached (``use_listings_cache=False``): the API and the workers are separate processes,
    and each must see the files the others write, replace and delete at once.
    """

    def __init__(
        self,
        url: str,
        limits: WorkspaceLimits,
        *,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        options = {"use_listings_cache": False, **(storage_options or {})}
        fs, root = fsspec.core.url_to_fs(url, **options)
        self.url = url
        self.limits = limits
        self._fs: fsspec.AbstractFileSystem = fs
        self._root = cast(str, root).rstrip("/") or "/"

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkspaceStore:
        """The store ``BATON_WORKSPACE_*`` configure (docs/workspaces.md, Storage)."""
        options: dict[str, Any] = {}
        if settings.workspace_s3_endpoint:
            options["endpoint_url"] = settings.workspace_s3_endpoint
        return cls(
            default_url(settings),
            WorkspaceLimits.from_settings(settings),
            storage_options=options,
        )

    def workspace(self, workspace_id: str) -> Workspace:
        """The workspace ``workspace_id`` (nothing is created until a file is written).
        Raises InvalidPath for an id that is no workspace id."""
        return Workspace(self._fs, self._root, workspace_id, self.limits)

    def open_ref(self, ref: FileRef) -> Workspace:
        """The workspace a reference points into."""
        return self.workspace(ref.workspace_id)


def workspace_for(s: Session, session_id: str) -> str:
    """The id of the workspace ``session_id`` works in: its caller's for a session a
    ``shareable`` delegation started (:func:`baton.workspaces.sharing.workspace_of`), else
    its own (its id). Raises SessionNotFound."""
    row = s.get(SessionRow, session_id)
    if row is None:
        raise SessionNotFound(f"no session '{session_id}'")
    return row.workspace_id or row.id
