"""The embedded stack (`baton dev`, `baton demo`) beside another stack on one machine: a
Temporal server it did not start is never taken for its own, a taken port is one line and
exit 1, each stack polls a task queue of its own, the banner waits for the API, and a
failing demo step fails `baton demo` (real processes, real Temporal dev servers)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

import worker.stack as stack_module
from baton.settings import Settings
from tests.conftest import migrated
from tests.helpers import READY_TIMEOUT_S
from tests.test_api_reviews import agent
from worker.stack import (
    DevServer,
    PortInUse,
    ServicesThread,
    free_port,
    port_free,
    stack_task_queue,
    stop_process,
)

ROOT = Path(__file__).resolve().parents[1]
BATON = str(Path(sys.executable).with_name("baton"))


def _env(**extra: str) -> dict[str, str]:
    """The environment of a `baton` process: no BATON_* of this run, wide, no colour."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATON_")}
    return env | {"COLUMNS": "300", "NO_COLOR": "1"} | extra


@dataclass
class Dev:
    """A running `baton dev`: its process, folder, ports and the lines it printed up to
    and including its banner."""

    proc: subprocess.Popen[str]
    folder: Path
    api: int
    frontend: int
    ui: int
    lines: list[str]

    @property
    def banner(self) -> str:
        return next(line for line in self.lines if "Baton is up" in line)


#: Output of a start that lost a port to another process between the pick and the bind.
PORT_RACE = re.compile(r"is already in use|address already in use", re.IGNORECASE)


def _start_dev(folder: Path) -> tuple[subprocess.Popen[str], tuple[int, int, int], list[str]]:
    """One `baton dev` in ``folder`` on free ports, read up to its banner (and the
    BATON_API_URL hint after it) or to the end of its output (a failed start exits)."""
    ports = (free_port(), free_port(), free_port())
    api, frontend, ui = (str(p) for p in ports)
    proc = subprocess.Popen(
        [BATON, "dev", "--port", api, "--temporal-port", frontend, "--ui-port", ui],
        env=_env(),
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if "Baton is up" in line:
            lines.append(proc.stdout.readline())
            break
    return proc, ports, lines


@contextmanager
def baton_dev(folder: Path) -> Iterator[Dev]:
    """`baton dev` in ``folder`` on free ports, up to its banner; stopped afterwards.

    A free port can be taken by any other process of a loaded machine before `baton dev`
    binds it (its refusal is one line and exit 1, tested on its own): such a start is
    tried again on fresh ports, up to three times. Any other failed start fails the test
    with everything it printed and the tail of its Temporal log."""
    folder.mkdir(parents=True, exist_ok=True)
    for _attempt in range(3):
        proc, (api, frontend, ui), lines = _start_dev(folder)
        if any("Baton is up" in line for line in lines):
            break
        stop_process(proc, timeout=60)
        if not PORT_RACE.search("".join(lines)):
            log = folder / ".baton" / "temporal.log"
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
            pytest.fail(f"`baton dev` did not start:\n{''.join(lines)}\n{tail}")
    else:
        pytest.fail(f"`baton dev` lost a port race three times:\n{''.join(lines)}")
    try:
        yield Dev(proc, folder, api, frontend, ui, lines)
    finally:
        stop_process(proc, timeout=60)


def test_dev_banner_prints_the_temporal_frontend_address(tmp_path: Path) -> None:
    """`baton dev` (a real process) prints the Temporal frontend it started in its banner;
    a SIGTERM right after the banner (before the services' own handler) still stops the
    Temporal dev server it started (it was left running, orphaned)."""
    with baton_dev(tmp_path) as dev:
        assert f"Temporal 127.0.0.1:{dev.frontend}  Temporal UI http://" in dev.banner
    deadline = time.monotonic() + READY_TIMEOUT_S  # polled: ends once the port is free
    while not port_free(dev.frontend) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert port_free(dev.frontend), "the Temporal dev server outlived `baton dev`"


def test_a_server_that_won_the_race_for_the_port_is_not_taken_for_ours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another stack's Temporal binding the port between our check and our child's bind:
    start() raises PortInUse (our child lost the bind) instead of returning as if the
    other server were ours; the other server keeps serving."""
    port = free_port()
    other = DevServer(port=port, ui_port=free_port(), db_file=None)
    binary = stack_module.temporal_binary
    raced: list[bool] = []

    def other_binds_first() -> Path:
        # Called once the port checks passed, right before the child is spawned: the
        # other stack takes the port in exactly that window.
        if not raced:
            raced.append(True)
            other.start()
        return binary()

    monkeypatch.setattr(stack_module, "temporal_binary", other_binds_first)
    ours = DevServer(port=port, ui_port=free_port(), db_file=None)
    try:
        with pytest.raises(PortInUse) as info:
            ours.start()
        assert (info.value.port, info.value.what) == (port, "Temporal frontend")
        assert str(info.value) == f"Temporal frontend port {port} is already in use"
        assert other._proc is not None and stack_module.listens(other._proc.pid, port)
    finally:
        ours.stop()
        other.stop()


@pytest.mark.timeout(600)  # a real `baton dev` start and stop, then two refused starts
def test_ports_taken_by_another_stack_are_one_line_and_exit_1(tmp_path: Path) -> None:
    """`baton dev` in a second folder on the first stack's Temporal port, then on its API
    port: exit 1 and one line naming the port and the flag; nothing is started."""
    with baton_dev(tmp_path / "a") as a:
        (tmp_path / "b").mkdir()
        for flags, line in (
            (
                ["--port", str(free_port()), "--temporal-port", str(a.frontend)],
                f"error Temporal frontend port {a.frontend} is already in use "
                "(--temporal-port, make demo TEMPORAL_PORT=…)",
            ),
            (
                ["--port", str(a.api), "--temporal-port", str(free_port())],
                f"error API port {a.api} is already in use (--port, make demo PORT=…)",
            ),
        ):
            out = subprocess.run(
                [BATON, "dev", *flags, "--ui-port", str(free_port())],
                env=_env(),
                cwd=tmp_path / "b",
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert out.returncode == 1, (out.stdout, out.stderr)
            assert [x for x in out.stderr.splitlines() if x.strip()] == [line]
            assert "Baton is up" not in out.stdout
        assert a.proc.poll() is None  # the first stack is untouched


@pytest.mark.timeout(600)  # two real `baton dev` starts and stops
def test_two_stacks_poll_their_own_task_queues_and_announce_only_a_serving_api(
    tmp_path: Path,
) -> None:
    """Two `baton dev` in two folders: each banner names the task queue of its folder
    (distinct), is printed once its API accepts connections (answered at once, no retry),
    and says the CLI needs BATON_API_URL off port 8000."""
    with baton_dev(tmp_path / "a") as a, baton_dev(tmp_path / "b") as b:
        queues = []
        for dev in (a, b):
            assert httpx.get(f"http://127.0.0.1:{dev.api}/healthz").status_code == 200
            (queue,) = re.findall(r"task queue (\S+)", dev.banner)
            assert queue == stack_task_queue(dev.folder / ".baton")
            hint = f"the CLI finds this API with: export BATON_API_URL=http://127.0.0.1:{dev.api}"
            assert hint in "".join(dev.lines)
            queues.append(queue)
        assert queues[0] != queues[1]


async def test_two_stacks_on_one_temporal_never_take_each_others_work(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """Two stacks (own databases, workers on their folders' queues) on one Temporal: every
    session launched on the first completes from its own database; none is taken by the
    other stack's worker (which would fail it with SessionNotFound)."""
    stacks = []
    try:
        for name in ("a", "b"):
            settings = Settings(
                database_url=migrated(f"sqlite:///{tmp_path / name}.db"),
                temporal_address=temporal_env.client.service_client.config.target_host,
                task_queue=stack_task_queue(tmp_path / name / ".baton"),
            )
            services = ServicesThread(settings, api_port=free_port())
            services.start()
            stacks.append(services)
        with httpx.Client(base_url=stacks[0].api_url, timeout=120) as http:
            agent(http, "echo", [{"reply": "echo says hi"}])
            sessions = []
            for _ in range(6):
                resp = http.post(
                    "/v1/sessions", json={"agent": "echo", "prompt": "hi", "sync": True}
                )
                assert resp.status_code == 201, resp.text
                assert resp.json()["response"] == "echo says hi", resp.text
                sessions.append(resp.json()["session_id"])
        # Retries would hide a task taken by the other stack (it fails there, then lands
        # here): every activity ran once and none failed.
        for session_id in sessions:
            history = await temporal_env.client.get_workflow_handle(session_id).fetch_history()
            for event in history.events:
                assert event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED, event
                if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                    assert event.activity_task_started_event_attributes.attempt == 1, event
    finally:
        for services in stacks:
            services.stop()


#: A whole demo (two runs, a team, a review) under a second suite's load: minutes.
@pytest.mark.timeout(900)
def test_a_failing_demo_step_fails_the_demo(tmp_path: Path) -> None:
    """`baton demo` on its own ports whose team member's turns fail (a model without a
    key): the demo names the failed delegation on stderr and exits 1 (it exited 0)."""
    examples = (ROOT / "examples" / "agents.yaml").read_text()
    hint = "        delegation_hint: verifies claims against sources\n"
    assert hint in examples
    broken = tmp_path / "agents.yaml"
    broken.write_text(examples.replace(hint, hint + "      model: openai:gpt-4o-mini\n", 1))
    ports = [str(free_port()) for _ in range(3)]
    flags = ["--port", ports[0], "--temporal-port", ports[1], "--ui-port", ports[2]]
    out = subprocess.run(
        [BATON, "demo", "-f", str(broken), *flags],
        env={k: v for k, v in _env().items() if k != "OPENAI_API_KEY"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 1, (out.stdout[-2000:], out.stderr[-2000:])
    assert "error fact-checker: delegation failed" in out.stderr, out.stderr[-3000:]
    assert f"http://127.0.0.1:{ports[0]}/ui/sessions/" in out.stdout


@pytest.mark.timeout(900)
def test_the_demo_shows_its_reviews_webhook_deliveries_to_the_local_receiver(
    tmp_path: Path,
) -> None:
    """`baton demo` on its own ports passes and prints the signed review.opened and
    review.resolved deliveries its local receiver verified, their decision link on the
    demo's API port, and the delivery log with both delivered."""
    ports = [free_port() for _ in range(3)]
    flags = ["--port", str(ports[0]), "--temporal-port", str(ports[1]), "--ui-port", str(ports[2])]
    out = subprocess.run(
        [BATON, "demo", "-f", str(ROOT / "examples" / "agents.yaml"), *flags],
        env={k: v for k, v in _env().items() if k != "OPENAI_API_KEY"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    shown = out.stdout.split("webhook deliveries", 1)[1]
    opened = re.search(r"^review\.opened (delivery-[0-9a-f-]{36}): lead → invoke", shown, re.M)
    resolved = re.search(r"^review\.resolved (delivery-[0-9a-f-]{36}): .* · allowed$", shown, re.M)
    assert opened and resolved, shown
    decide = f"decide at: POST http://127.0.0.1:{ports[0]}/v1/reviews/review-"
    assert decide in shown, shown
    for delivery in (opened[1], resolved[1]):
        assert re.search(rf"log: {delivery} delivered after \d+ attempt", shown), shown


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make to read the Makefile")
def test_make_demo_passes_its_ports_to_baton_demo() -> None:
    """`make demo PORT=… TEMPORAL_PORT=… UI_PORT=…` runs `baton demo` with those ports;
    without them, with none."""
    shown = subprocess.run(
        ["make", "-n", "demo", "PORT=8010", "TEMPORAL_PORT=7300", "UI_PORT=8300"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert "baton demo --port 8010 --temporal-port 7300 --ui-port 8300" in shown.stdout
    plain = subprocess.run(
        ["make", "-n", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
    )
    assert re.search(r"baton demo\s*$", plain.stdout, re.MULTILINE), plain.stdout
