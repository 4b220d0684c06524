"""deploy/ agrees with the code: no Docker daemon or cluster here, so
the manifests are rendered and checked offline — every BATON_* variable is a real
setting, every probe path a real route, every command a real `baton` command, ports
and grace periods line up."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from api.app import create_app
from baton.settings import Settings
from cli import app as cli_app

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "k8s" / "base"
OVERLAY = DEPLOY / "k8s" / "overlays" / "example"
SETTING_NAMES = {f"BATON_{name.upper()}" for name in Settings.model_fields}
BATON_VAR = re.compile(r"\bBATON_[A-Z0-9_]+\b")
API_PORT = 8000


def load_all(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kustomize_available() -> bool:
    """kubectl with a kustomize that reads `resources: [dir]` and `replicas:` (v4+)."""
    if shutil.which("kubectl") is None:
        return False
    out = subprocess.run(
        ["kubectl", "version", "--client"], capture_output=True, text=True, check=False
    )
    found = re.search(r"Kustomize Version: v(\d+)", out.stdout)
    return bool(found and int(found.group(1)) >= 4)


def python_render() -> list[dict[str, Any]]:
    """The overlay assembled without kustomize, for machines without kubectl: base and
    overlay resources, generated ConfigMap/Secret (no hash suffix), images, replicas."""
    base_k = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    over_k = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())
    docs = [d for f in base_k["resources"] for d in load_all(BASE / f)]
    docs += [
        d for f in over_k["resources"] if not f.startswith("..") for d in load_all(OVERLAY / f)
    ]

    def literals(gen: dict[str, Any]) -> dict[str, str]:
        return dict(item.split("=", 1) for item in gen.get("literals", []))

    config: dict[str, str] = {}
    for gen in base_k.get("configMapGenerator", []) + over_k.get("configMapGenerator", []):
        config |= literals(gen)
    docs.append({"kind": "ConfigMap", "metadata": {"name": "baton-config"}, "data": config})
    for gen in over_k.get("secretGenerator", []):
        docs.append({"kind": "Secret", "metadata": {"name": gen["name"]}, "data": literals(gen)})
    image = {i["name"]: f"{i['newName']}:{i['newTag']}" for i in over_k.get("images", [])}
    counts = {r["name"]: r["count"] for r in over_k.get("replicas", [])}
    for doc in docs:
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] in counts:
            doc["spec"]["replicas"] = counts[doc["metadata"]["name"]]
        for c in containers(doc):
            c["image"] = image.get(c["image"], c["image"])
    return docs


@cache
def kustomize_render() -> str:
    out = subprocess.run(
        ["kubectl", "kustomize", str(OVERLAY)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def rendered() -> list[dict[str, Any]]:
    """The example overlay as kubectl would apply it (kustomize, else :func:`python_render`)."""
    if kustomize_available():
        return [d for d in yaml.safe_load_all(kustomize_render()) if d]
    return python_render()


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    found: list[dict[str, Any]] = spec.get("containers", [])
    return found


def of_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return loaded


def baton_services() -> dict[str, dict[str, Any]]:
    """Compose services that run the Baton image."""
    image = compose()["x-baton"]["image"]
    return {n: s for n, s in compose()["services"].items() if s.get("image") == image}


def cli_command(args: list[str]) -> Any:
    """The `baton` command that ``args`` invoke (a click command); fails when there is none."""
    command: Any = typer.main.get_command(cli_app)
    for word in args:
        if word.startswith("-"):
            break
        subcommands = getattr(command, "commands", None)
        assert subcommands is not None, f"{args}: {word} follows a leaf command"
        command = subcommands.get(word)
        assert command is not None, f"`baton {' '.join(args)}`: no command {word!r}"
    options = {opt for p in command.params for opt in p.opts}
    for word in args:
        if word.startswith("--"):
            assert word in options, f"`baton {' '.join(args)}`: no option {word}"
    return command


def commands() -> Iterator[tuple[str, list[str]]]:
    """(where, args) of every Baton process deploy/ starts: compose and Kubernetes."""
    for name, service in baton_services().items():
        yield f"compose {name}", service["command"]
    for doc in rendered():
        for c in containers(doc):
            if "baton" in c["image"]:
                yield f"{doc['kind']} {doc['metadata']['name']}", c["args"]


# --- rendering ---------------------------------------------------------------------


def test_overlay_renders_with_kubectl_kustomize() -> None:
    """`kubectl kustomize deploy/k8s/overlays/example` renders, with generated names wired."""
    if not kustomize_available():
        pytest.skip(
            "kubectl with kustomize v4+ is not installed (Debian's kubernetes-client ships "
            "v2); the other checks here run on a Python assembly of the same files"
        )
    docs = [d for d in yaml.safe_load_all(kustomize_render()) if d]
    config = next(n for n in of_kind(docs, "ConfigMap") if n.startswith("baton-config-"))
    secret = next(n for n in of_kind(docs, "Secret") if n.startswith("baton-secrets-"))
    for doc in docs:
        for c in containers(doc):
            refs = {r.get("configMapRef", r.get("secretRef", {}))["name"] for r in c["envFrom"]}
            assert refs == {config, secret}, doc["metadata"]["name"]
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {"baton"}


def test_python_render_matches_the_files() -> None:
    """The kubectl-free assembly finds every Deployment, Job, PDB and both env sources."""
    docs = python_render()
    assert set(of_kind(docs, "Deployment")) == {"baton-api", "baton-worker"}
    assert set(of_kind(docs, "Job")) == {"baton-db-upgrade", "baton-setup"}
    assert set(of_kind(docs, "PodDisruptionBudget")) == {"baton-api", "baton-worker"}
    assert "BATON_DATABASE_URL" in of_kind(docs, "Secret")["baton-secrets"]["data"]


# --- settings, routes, commands, ports -------------------------------------------------


def deploy_env_names() -> Iterator[tuple[str, str]]:
    """(where, name) of every BATON_* variable compose and the manifests set."""
    spec = compose()
    for name, service in spec["services"].items():
        for var in service.get("environment") or {}:
            if var.startswith("BATON_"):
                yield f"compose {name}", var
    for doc in rendered():
        where = f"{doc['kind']} {doc['metadata']['name']}"
        names = list(doc.get("data", {})) + list(doc.get("stringData", {}))
        names += [env["name"] for c in containers(doc) for env in c.get("env", [])]
        yield from ((where, n) for n in names if n.startswith("BATON_"))
    for path in [DEPLOY / "Dockerfile", *sorted(DEPLOY.rglob("*.yaml"))]:
        for var in BATON_VAR.findall(path.read_text()):
            yield str(path.relative_to(ROOT)), var


def test_every_baton_variable_is_a_setting() -> None:
    """Each BATON_* name in compose, the manifests and the Dockerfile is a Settings field."""
    allowed = SETTING_NAMES | {"BATON_VERSION"}  # BATON_VERSION: the image's build label
    unknown = sorted({(w, v) for w, v in deploy_env_names() if v not in allowed})
    assert unknown == []
    names = {v for _, v in deploy_env_names()}
    assert {"BATON_DATABASE_URL", "BATON_TEMPORAL_ADDRESS", "BATON_WORKER_GRACEFUL_SHUTDOWN_S"} <= (
        names
    )


def test_settings_check_catches_a_typo() -> None:
    """The setting check can fail: a misspelled name is not a Settings field."""
    assert "BATON_DATABASE_URI" not in SETTING_NAMES
    assert "BATON_DATABASE_URL" in SETTING_NAMES


def route_paths() -> set[str]:
    return {getattr(r, "path", "") for r in create_app(Settings()).routes}


def probe_paths() -> Iterator[tuple[str, str]]:
    for doc in rendered():
        for c in containers(doc):
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                if probe in c:
                    yield f"{doc['metadata']['name']} {probe}", c[probe]["httpGet"]["path"]
    for name, service in baton_services().items():
        test = " ".join(service.get("healthcheck", {}).get("test", []))
        for path in re.findall(rf"127\.0\.0\.1:{API_PORT}(/[a-z/]*)", test):
            yield f"compose {name} healthcheck", path


def test_every_probe_path_is_a_route() -> None:
    """Readiness, liveness and compose healthcheck paths are routes of the FastAPI app."""
    routes = route_paths()
    probes = list(probe_paths())
    assert {p for _, p in probes} >= {"/healthz", "/readyz"}
    assert [(w, p) for w, p in probes if p not in routes] == []


def test_every_command_is_a_baton_command() -> None:
    """Each process deploy/ starts is a `baton` command with options that exist."""
    seen = set()
    for where, args in commands():
        cli_command(args)
        seen.add(" ".join(a for a in args[:2] if not a.startswith("-")))
        assert args, where
    assert {"api", "worker", "db upgrade", "setup"} <= seen


def test_command_check_catches_an_unknown_command() -> None:
    """The command check can fail: `baton db migrate` and `baton api --listen` do not exist."""
    with pytest.raises(AssertionError, match="no command 'migrate'"):
        cli_command(["db", "migrate"])
    with pytest.raises(AssertionError, match="no option --listen"):
        cli_command(["api", "--listen", "0.0.0.0"])


def test_one_image_everywhere() -> None:
    """Every Baton container in the overlay runs the one overlay image; compose builds one."""
    docs = rendered()
    images = {c["image"] for d in docs for c in containers(d)}
    over_k = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())
    (entry,) = over_k["images"]
    assert entry["name"] == "baton"
    assert images == {f"{entry['newName']}:{entry['newTag']}"}
    assert {s["build"]["dockerfile"] for s in baton_services().values()} == {"deploy/Dockerfile"}


def test_ports_line_up() -> None:
    """API port: `--port`, containerPort, Service targetPort, compose mapping, EXPOSE."""
    docs = rendered()
    api = of_kind(docs, "Deployment")["baton-api"]
    (container,) = containers(api)
    args = container["args"]
    assert args[args.index("--port") + 1] == str(API_PORT)
    (port,) = container["ports"]
    assert port["containerPort"] == API_PORT
    service = of_kind(docs, "Service")["baton-api"]
    assert [p["targetPort"] for p in service["spec"]["ports"]] == [port["name"]]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == port["name"]
    for name, svc in baton_services().items():
        if svc["command"][0] == "api":
            cmd = svc["command"]
            assert cmd[cmd.index("--port") + 1] == str(API_PORT), name
            assert [p.split(":")[1] for p in svc["ports"]] == [str(API_PORT)], name
    assert f"EXPOSE {API_PORT}" in (DEPLOY / "Dockerfile").read_text()


def test_worker_grace_outlasts_its_drain() -> None:
    """terminationGracePeriodSeconds and stop_grace_period exceed the worker's SIGTERM drain."""
    docs = rendered()
    config = next(iter(of_kind(docs, "ConfigMap").values()))["data"]
    drain = float(config["BATON_WORKER_GRACEFUL_SHUTDOWN_S"])
    assert drain == Settings().worker_graceful_shutdown_s
    worker = of_kind(docs, "Deployment")["baton-worker"]
    grace = worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert drain < grace <= drain + 60
    service = compose()["services"]["worker"]
    assert float(service["environment"]["BATON_WORKER_GRACEFUL_SHUTDOWN_S"]) == drain
    assert drain < float(service["stop_grace_period"].removesuffix("s")) <= drain + 60


def test_deployments_are_production_shaped() -> None:
    """Probes on the API, requests and limits everywhere, non-root, PDBs select real pods."""
    docs = rendered()
    deployments = of_kind(docs, "Deployment")
    for doc in [*deployments.values(), *of_kind(docs, "Job").values()]:
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for c in containers(doc):
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), doc["metadata"]["name"]
            assert "memory" in c["resources"]["limits"], doc["metadata"]["name"]
            kinds = {next(iter(r)) for r in c["envFrom"]}
            assert kinds == {"configMapRef", "secretRef"}, doc["metadata"]["name"]
    (api,) = containers(deployments["baton-api"])
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    for name, pdb in of_kind(docs, "PodDisruptionBudget").items():
        labels = deployments[name]["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert pdb["spec"]["minAvailable"] < deployments[name]["spec"]["replicas"]
    jobs = {tuple(c["args"]) for j in of_kind(docs, "Job").values() for c in containers(j)}
    assert jobs == {("db", "upgrade"), ("setup",)}


# --- compose and the Dockerfile -------------------------------------------------------


def test_compose_runs_temporal_the_current_way() -> None:
    """admin-tools sets up both schemas, then temporalio/server; no auto-setup image."""
    services = compose()["services"]
    images = {n: s.get("image", "") for n, s in services.items()}
    assert not [n for n, i in images.items() if "auto-setup" in i]
    schema = services["temporal-schema"]
    assert images["temporal-schema"].startswith("temporalio/admin-tools:")
    script = "\n".join(schema["command"])
    for db in ("temporal", "temporal_visibility"):
        for verb in ("create", "setup-schema", "update-schema"):
            assert re.search(rf"--db {db} {verb}\b", script) or (
                verb == "create" and "for db in temporal temporal_visibility" in script
            ), (db, verb)
    assert images["temporal"].startswith("temporalio/server:")
    cond = services["temporal"]["depends_on"]["temporal-schema"]["condition"]
    assert cond == "service_completed_successfully"
    assert images["temporal-ui"].startswith("temporalio/ui:")
    assert images["postgresql"].startswith("postgres:")


def test_compose_runs_jobs_before_two_apis_and_two_workers() -> None:
    """Migration and setup jobs complete before 2 API replicas and 2 workers start."""
    services = baton_services()
    apis = [n for n, s in services.items() if s["command"][0] == "api"]
    workers = [n for n, s in services.items() if s["command"] == ["worker"]]
    replicas = sum(services[n].get("deploy", {}).get("replicas", 1) for n in workers)
    assert len(apis) == 2
    assert replicas == 2
    assert services["baton-migrate"]["command"] == ["db", "upgrade"]
    assert services["baton-setup"]["command"] == ["setup"]
    for name in [*apis, *workers]:
        depends = services[name]["depends_on"]
        for job in ("baton-migrate", "baton-setup"):
            assert depends[job]["condition"] == "service_completed_successfully", name
    for name in apis:
        assert "healthcheck" in services[name]
    every = compose()["services"]
    for name, service in every.items():
        for dep, how in (service.get("depends_on") or {}).items():
            assert dep in every, (name, dep)
            if "healthcheck" not in every[dep]:
                assert how["condition"] != "service_healthy", (name, dep)


def test_dockerfile_is_small_non_root_and_versioned() -> None:
    """Multi-stage, a non-root USER, `baton` entrypoint, the package version baked in."""
    text = (DEPLOY / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) >= 2
    (user,) = re.findall(r"^USER (\S+)", text, re.M)
    assert not user.startswith(("root", "0:")) and user != "0"
    assert re.search(r'^ENTRYPOINT \["baton"\]', text, re.M)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"ARG BATON_VERSION={version}" in text
    assert 'org.opencontainers.image.version="${BATON_VERSION}"' in text
    assert compose()["x-baton"]["image"] == f"baton:${{BATON_VERSION:-{version}}}"
    cmd = yaml.safe_load(re.search(r"^CMD (.+)$", text, re.M).group(1))  # type: ignore[union-attr]
    cli_command(cmd)
    copied = set(re.findall(r"^COPY (\w+) \./\1$", text, re.M))
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    wanted = {p.rstrip("*") for p in packages["packages"]["find"]["include"]}
    assert copied == wanted
