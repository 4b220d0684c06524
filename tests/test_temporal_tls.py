"""The Temporal connection: envconfig profiles, TLS/mTLS through a real TLS terminator,
precedence of BATON_TEMPORAL_*, and one-line startup failures of `baton worker` / `baton api`.

The dev server speaks plain gRPC, so :class:`Forwarder` terminates TLS in front of it
(ALPN ``h2``, client certificate required) with certificates made by ``trustme``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from temporalio.testing import WorkflowEnvironment

from baton.contracts.workflow_io import Provenance
from baton.errors import EngineUnavailable, InvalidSettings
from baton.runs.launch import launch_session
from baton.settings import Settings
from baton.storage.db import init_db, make_engine
from tests.conftest import migrated
from tests.forwarder import Forwarder
from tests.helpers import TEST_CONFIG, publish
from worker.factory import connect, describe_target, temporal_connect_config
from worker.stack import free_port

BATON = str(Path(sys.executable).parent / "baton")


class Pki:
    """A throwaway CA, a server certificate for localhost and a client certificate, on disk."""

    def __init__(self, folder: Path) -> None:
        self.ca = trustme.CA()
        self.server = self.ca.issue_cert("localhost", "127.0.0.1")
        client = self.ca.issue_cert("baton-worker@example.test")
        self.ca_file = folder / "ca.pem"
        self.client_cert = folder / "client.pem"
        self.client_key = folder / "client.key"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        client.cert_chain_pems[0].write_to_path(str(self.client_cert))
        client.private_key_pem.write_to_path(str(self.client_key))
        other = trustme.CA()  # trusted by nobody: the "wrong CA"
        self.wrong_ca_file = folder / "wrong-ca.pem"
        other.cert_pem.write_to_path(str(self.wrong_ca_file))

    def server_context(self) -> ssl.SSLContext:
        """TLS for the forwarder: h2 over ALPN (gRPC needs it), client certificate required."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server.configure_cert(ctx)
        self.ca.configure_trust(ctx)
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.set_alpn_protocols(["h2"])
        return ctx


def profile_toml(address: str, pki: Pki, *, ca: Path | None = None, mtls: bool = True) -> str:
    """A Temporal CLI config file whose default profile reaches ``address`` over TLS."""
    lines = [
        "[profile.default]",
        f'address = "{address}"',
        'namespace = "default"',
        "[profile.default.tls]",
        'server_name = "localhost"',
        f'server_ca_cert_path = "{ca or pki.ca_file}"',
    ]
    if mtls:
        lines += [
            f'client_cert_path = "{pki.client_cert}"',
            f'client_key_path = "{pki.client_key}"',
        ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """Certificates for the module's TLS terminator and clients."""
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_front(temporal_env: WorkflowEnvironment, pki: Pki) -> Iterator[Forwarder]:
    """A TLS terminator (mTLS required) in front of the session's dev server."""
    fwd = Forwarder(temporal_env.client.service_client.config.target_host, pki.server_context())
    fwd.start()
    try:
        yield fwd
    finally:
        fwd.stop()


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without BATON_* / TEMPORAL_* settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BATON_", "TEMPORAL_"))}
    env.update(extra)
    return env


@pytest.fixture
def no_temporal_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TEMPORAL_* / BATON_TEMPORAL_* variable of the machine leaks into a test."""
    for key in list(os.environ):
        if key.startswith(("TEMPORAL_", "BATON_TEMPORAL_")):
            monkeypatch.delenv(key)


@pytest.mark.usefixtures("no_temporal_env")
async def test_a_profile_with_ca_and_client_certificate_runs_a_session_over_mtls(
    tls_front: Forwarder, pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A profile file (CA + client cert) is all it takes: worker and launch work over mTLS."""
    from worker.factory import build_worker

    config = tmp_path / "temporal.toml"
    config.write_text(profile_toml(tls_front.address, pki))
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(config))
    settings = Settings(_env_file=None, database_url=f"sqlite:///{tmp_path / 'b.db'}")
    assert describe_target(temporal_connect_config(settings)) == (
        f"{tls_front.address} (namespace default, mTLS)"
    )
    engine = make_engine(settings.database_url)
    init_db(engine)
    publish(
        engine,
        "tls-helper",
        tools=["calculator"],
        playbook=[
            {"when": "calculator:", "reply": "It is {last_message}"},
            {
                "reply": "Computing.",
                "tool_calls": [{"tool": "calculator", "args": {"expression": "6*7"}}],
            },
        ],
    )
    client = await connect(settings)
    assert client.service_client.config.target_host == tls_front.address
    queue = f"tq-{uuid.uuid4()}"
    try:
        async with build_worker(client, engine=engine, task_queue=queue):
            launched = await launch_session(
                client,
                engine,
                task_queue=queue,
                config=TEST_CONFIG,
                ref="tls-helper",
                prompt="6 times 7?",
                provenance=Provenance(),
                sync=True,
            )
    finally:
        engine.dispose()
    assert launched.response == "It is 42"


@pytest.mark.usefixtures("no_temporal_env")
async def test_without_a_client_certificate_the_mtls_front_refuses_clearly(
    tls_front: Forwarder, pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TLS with the right CA but no client certificate: EngineUnavailable naming the target."""
    config = tmp_path / "temporal.toml"
    config.write_text(profile_toml(tls_front.address, pki, mtls=False))
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(config))
    # A refusal, not a timeout: told apart by what the error says, not by the clock (a
    # loaded machine can take seconds for a handshake); the long timeout never fires.
    settings = Settings(_env_file=None, temporal_connect_timeout=120)
    with pytest.raises(EngineUnavailable) as info:
        await connect(settings)
    assert "no answer within" not in info.value.detail
    assert (
        f"cannot reach Temporal at {tls_front.address} (namespace default, TLS)"
        in info.value.detail
    )


@pytest.mark.usefixtures("no_temporal_env")
def test_explicit_baton_settings_win_and_defaults_do_not_mask_the_profile(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Profile address/namespace apply unless BATON_TEMPORAL_* is set; TEMPORAL_* beats the file."""
    config = tmp_path / "temporal.toml"
    config.write_text(
        '[profile.default]\naddress = "file-host:7233"\nnamespace = "file-ns"\n'
        '[profile.cloud]\naddress = "cloud.example:7233"\napi_key = "k-123-secret"\n'
    )
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(config))
    default = temporal_connect_config(Settings(_env_file=None))
    assert (default["target_host"], default["namespace"]) == ("file-host:7233", "file-ns")

    monkeypatch.setenv("BATON_TEMPORAL_ADDRESS", "baton-host:7233")
    explicit = temporal_connect_config(Settings(_env_file=None))
    assert (explicit["target_host"], explicit["namespace"]) == ("baton-host:7233", "file-ns")
    monkeypatch.delenv("BATON_TEMPORAL_ADDRESS")

    monkeypatch.setenv("TEMPORAL_NAMESPACE", "env-ns")
    assert temporal_connect_config(Settings(_env_file=None))["namespace"] == "env-ns"

    monkeypatch.setenv("TEMPORAL_PROFILE", "cloud")
    cloud = temporal_connect_config(Settings(_env_file=None))
    assert cloud["target_host"] == "cloud.example:7233" and cloud["tls"] is True
    assert "k-123-secret" not in describe_target(cloud)
    assert describe_target(cloud) == "cloud.example:7233 (namespace env-ns, TLS, API key)"

    off = temporal_connect_config(Settings(_env_file=None, temporal_env_config=False))
    assert off == {"target_host": "localhost:7233", "namespace": "default"}

    monkeypatch.setenv("TEMPORAL_PROFILE", "missing")
    with pytest.raises(InvalidSettings, match="Profile 'missing' not found"):
        temporal_connect_config(Settings(_env_file=None))


def _run_service(
    cmd: list[str], env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``baton CMD`` as a real process. ``timeout`` only stops a hang: generous, since a
    process start under a second test suite's load can take tens of seconds."""
    return subprocess.run(
        [BATON, *cmd], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The single error line of a failed start (asserts: exit 1, no traceback)."""
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize("command", ["worker", "api"])
def test_a_wrong_ca_is_one_line_and_exit_1(
    command: str, tls_front: Forwarder, pki: Pki, tmp_path: Path
) -> None:
    """`baton worker` / `baton api` against a server the CA does not vouch for: one line, exit 1."""
    config = tmp_path / "temporal.toml"
    config.write_text(profile_toml(tls_front.address, pki, ca=pki.wrong_ca_file))
    env = _clean_env(
        TEMPORAL_CONFIG_FILE=str(config),
        BATON_DATABASE_URL=migrated(f"sqlite:///{tmp_path / 'b.db'}"),
        # A refusal, not a timeout (told apart by the message): this one never fires.
        BATON_TEMPORAL_CONNECT_TIMEOUT="120",
    )
    cmd = [command] if command == "worker" else [command, "--port", str(free_port())]
    line = _one_line_error(_run_service(cmd, env))
    assert "no answer within" not in line
    assert f"[engine_unavailable]: cannot reach Temporal at {tls_front.address}" in line
    assert "(namespace default, mTLS)" in line


def test_a_silent_address_times_out_instead_of_hanging(tmp_path: Path) -> None:
    """An address that accepts TCP but never answers fails after the connect timeout: it
    waits at least the timeout, and at most a minute more than the same start against a
    refused address (the same run's baseline for starting the process under this load)."""
    db = migrated(f"sqlite:///{tmp_path / 'b.db'}")
    refused = _clean_env(BATON_TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}", BATON_DATABASE_URL=db)
    started = time.monotonic()
    _one_line_error(_run_service(["worker"], refused))
    baseline = time.monotonic() - started
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        env = _clean_env(
            BATON_TEMPORAL_ADDRESS=address,
            BATON_TEMPORAL_CONNECT_TIMEOUT="2",
            BATON_DATABASE_URL=db,
        )
        started = time.monotonic()
        line = _one_line_error(_run_service(["worker"], env, timeout=baseline + 2 + 60))
        assert time.monotonic() - started >= 2
    assert line.endswith(
        f"cannot reach Temporal at {address} (namespace default): no answer within 2 s"
    )


def test_a_refused_temporal_address_is_one_line_for_baton_api(tmp_path: Path) -> None:
    """`baton api` with nothing listening on the Temporal port: one line, exit 1, no serving."""
    closed = f"127.0.0.1:{free_port()}"
    env = _clean_env(
        BATON_TEMPORAL_ADDRESS=closed, BATON_DATABASE_URL=migrated(f"sqlite:///{tmp_path / 'b.db'}")
    )
    line = _one_line_error(_run_service(["api", "--port", str(free_port())], env))
    assert f"cannot reach Temporal at {closed} (namespace default): " in line
    assert "Connection refused" in line


def test_an_unreachable_database_is_one_line_for_baton_worker(
    temporal_env: WorkflowEnvironment,
) -> None:
    """`baton worker` with PostgreSQL down: one line naming the redacted URL, exit 1."""
    dead_pg = f"postgresql+psycopg://baton:pw-s3cret@127.0.0.1:{free_port()}/baton"
    env = _clean_env(
        BATON_TEMPORAL_ADDRESS=temporal_env.client.service_client.config.target_host,
        BATON_DATABASE_URL=dead_pg,
    )
    line = _one_line_error(_run_service(["worker"], env))
    assert (
        "[database_unavailable]: cannot reach the database at postgresql+psycopg://baton:***@"
        in line
    )
    assert "pw-s3cret" not in line


@pytest.mark.usefixtures("no_temporal_env")
async def test_baton_worker_over_mtls_serves_and_exits_0_on_sigterm(
    tls_front: Forwarder, pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real `baton worker` reaches Temporal through a profile over mTLS and stops cleanly."""
    config = tmp_path / "temporal.toml"
    config.write_text(profile_toml(tls_front.address, pki))
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(config))
    db = f"sqlite:///{tmp_path / 'b.db'}"
    queue = f"tq-{uuid.uuid4()}"
    engine = make_engine(db)
    init_db(engine)
    publish(engine, "tls-echo", playbook=[{"reply": "over TLS"}])
    proc = subprocess.Popen(
        [BATON, "worker"],
        env=_clean_env(
            TEMPORAL_CONFIG_FILE=str(config), BATON_DATABASE_URL=db, BATON_TASK_QUEUE=queue
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        client = await connect(Settings(_env_file=None))
        launched = await launch_session(
            client,
            engine,
            task_queue=queue,
            config=TEST_CONFIG,
            ref="tls-echo",
            prompt="hi",
            provenance=Provenance(),
            sync=True,
        )
        assert launched.response == "over TLS"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = await asyncio.to_thread(proc.communicate, timeout=60)
        engine.dispose()
    assert proc.returncode == 0, err
    assert f"at {tls_front.address} (namespace default, mTLS)" in out
