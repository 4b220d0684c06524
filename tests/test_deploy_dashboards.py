"""deploy/monitoring: the Grafana dashboard and the Prometheus alert rules name only
metrics a running stack exports (Baton's and the Temporal SDK's, scraped over HTTP), and
every expression in them is PromQL that Prometheus's own ``promtool`` accepts."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from temporalio.testing import WorkflowEnvironment

from tests.test_api_reviews import (
    INVOKE_SYNC,
    agent,
    decide,
    launch,
    pending,
    running_stack,
    settled,
    target,
)
from tests.xagent_helpers import caller_playbook
from worker.stack import free_port

MONITORING = Path(__file__).resolve().parent.parent / "deploy" / "monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"
ALERTS = MONITORING / "alerts.yaml"
#: Every metric Baton or the Temporal SDK exports starts with one of these.
METRIC = re.compile(r"\b(?:baton|temporal)_[a-z0-9_]+\b")
#: The metric name that starts a sample line of the Prometheus text format.
SAMPLE_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
#: Grafana's range variable, given a fixed range for promtool.
GRAFANA_RANGE = "$__rate_interval"


def dashboard_expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(panel title, PromQL)`` of every query of ``dashboard`` (rows included)."""
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for query in inner.get("targets", []):
                yield inner["title"], query["expr"]


def alert_expressions(rules: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(alert name, PromQL)`` of every rule of a Prometheus rules file."""
    for group in rules["groups"]:
        for rule in group["rules"]:
            yield rule.get("alert") or rule["record"], rule["expr"]


def every_expression() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    rules = yaml.safe_load(ALERTS.read_text())
    return [*dashboard_expressions(dashboard), *alert_expressions(rules)]


def metrics_named(expr: str) -> set[str]:
    """The metric names ``expr`` reads (label values such as ``model_turn`` never match)."""
    return set(METRIC.findall(expr))


def missing(expressions: list[tuple[str, str]], exported: set[str]) -> list[str]:
    """``where: name`` for each metric named in ``expressions`` that ``exported`` lacks."""
    return [
        f"{where}: {name}"
        for where, expr in expressions
        for name in sorted(metrics_named(expr))
        if name not in exported
    ]


@cache
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool missing: `apt-get install prometheus` (.ci/run does it)")
    return found


def promtool_check(
    expressions: list[tuple[str, str]], folder: Path
) -> subprocess.CompletedProcess[str]:
    """``promtool check rules`` over ``expressions`` written as recording rules."""
    rules = {
        "groups": [
            {
                "name": "check",
                "rules": [
                    {"record": f"check:expr{i}", "expr": expr.replace(GRAFANA_RANGE, "5m")}
                    for i, (_, expr) in enumerate(expressions)
                ],
            }
        ]
    }
    path = folder / "check.yaml"
    path.write_text(yaml.safe_dump(rules))
    return subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, check=False
    )


def scraped_names(url: str) -> set[str]:
    """The sample names (``x_total``, ``x_bucket``, ``x_count``…) served at ``url``, as
    Prometheus stores them: read off each sample line, since prometheus-client's parser
    adds ``_total`` to a counter served without it (Prometheus does not)."""
    resp = httpx.get(url, timeout=10)
    assert resp.status_code == 200, resp.text
    names = {SAMPLE_NAME.match(line) for line in resp.text.splitlines() if line[:1] != "#"}
    return {m.group(0) for m in names if m is not None}


def test_every_metric_on_the_dashboard_and_in_the_alerts_is_exported(
    temporal_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """A stack with a balance that ran a priced turn, a review and a delegation exports
    every metric the dashboard and the alert rules name, on the worker's endpoint or the
    API's /metrics."""
    bind = f"127.0.0.1:{free_port()}"
    with running_stack(
        temporal_env, tmp_path / "m.db", metrics_bind=bind, prices={"scripted": (1.0, 2.0)}
    ) as stack:
        http = stack.http
        assert http.put("/v1/balance", json={"balance": 20.0}).status_code == 200
        target(http)
        agent(http, "caller", caller_playbook("invoke_agent", INVOKE_SYNC))
        sid = launch(http, "caller")
        (review,) = pending(http)
        assert decide(http, review["id"], "allow_once").status_code == 200
        settled(http, sid)
        exported = scraped_names(f"http://{bind}/metrics") | scraped_names(f"{stack.url}/metrics")
    expressions = every_expression()
    named = {n for _, e in expressions for n in metrics_named(e)}
    assert {
        "baton_turns_total",
        "baton_reviews_opened_total",
        "baton_reviews_total",
        "baton_review_decision_seconds_bucket",
        "baton_balance_usd",
        "temporal_num_pollers",
    } <= named
    assert missing(expressions, exported) == []


def test_the_metric_check_names_a_misspelled_metric() -> None:
    """A metric no one exports is reported with where it is used; label values are not
    taken for metric names."""
    exprs = [("p", 'rate(baton_turn_total{activity_type="model_turn"}[5m])')]
    assert missing(exprs, {"baton_turns_total"}) == ["p: baton_turn_total"]
    assert missing(exprs, {"baton_turn_total"}) == []


def test_every_expression_is_valid_promql(tmp_path: Path) -> None:
    """promtool accepts the alert rules file and every dashboard query."""
    rules = subprocess.run(
        [promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )
    assert rules.returncode == 0, rules.stdout + rules.stderr
    checked = promtool_check(every_expression(), tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_promtool_refuses_a_broken_expression(tmp_path: Path) -> None:
    """The PromQL check is real: an unbalanced expression fails it."""
    checked = promtool_check([("p", "sum(rate(baton_turns_total[5m])")], tmp_path)
    assert checked.returncode != 0


def balance_alerts(tmp_path: Path, series: str, values: str) -> subprocess.CompletedProcess[str]:
    """``promtool test rules``: with ``series`` (``baton_balance_usd`` samples, one a
    minute, promtool's ``values`` notation), BatonBalanceLow fires at 6 minutes exactly
    when ``values`` is under :data:`BALANCE_LOW_USD` there (none when it is absent)."""
    below = values.split("x")[0] if series else None
    low = below is not None and float(below) < BALANCE_LOW_USD
    expected = (
        [
            {
                "exp_labels": {"severity": "warning"},
                "exp_annotations": {
                    "summary": f"The balance is {float(below):g} USD",
                    "description": BALANCE_LOW["annotations"]["description"],
                },
            }
        ]
        if low and below is not None
        else []
    )
    test = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": series, "values": values}] if series else [],
                "alert_rule_test": [
                    {"eval_time": "6m", "alertname": "BatonBalanceLow", "exp_alerts": expected}
                ],
            }
        ],
    }
    path = tmp_path / "balance_test.yaml"
    path.write_text(yaml.safe_dump(test))
    return subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, text=True, check=False
    )


BALANCE_LOW = next(
    rule
    for group in yaml.safe_load(ALERTS.read_text())["groups"]
    for rule in group["rules"]
    if rule.get("alert") == "BatonBalanceLow"
)
#: The documented threshold of BatonBalanceLow (docs/deployment.md), in USD.
BALANCE_LOW_USD = 5.0


@pytest.mark.parametrize(
    ("series", "values"),
    [
        ('baton_balance_usd{instance="api-0"}', "4.99x10"),
        ('baton_balance_usd{instance="api-0"}', "5x10"),
        ('baton_balance_usd{instance="api-0"}', "40x10"),
        ("", ""),
    ],
    ids=["under", "at", "above", "unlimited"],
)
def test_balance_low_fires_under_its_threshold_only(
    tmp_path: Path, series: str, values: str
) -> None:
    """BatonBalanceLow fires for a balance under 5 USD held 5 minutes, not at 5 USD, not
    above, and not while the balance is unlimited (no sample); promtool evaluates it."""
    assert BALANCE_LOW["expr"].strip() == f"max(baton_balance_usd) < {BALANCE_LOW_USD:g}"
    run = balance_alerts(tmp_path, series, values)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_balance_check_fails_when_the_alert_disagrees(tmp_path: Path) -> None:
    """The promtool rule test is real: expecting no alert where BatonBalanceLow fires
    fails it."""
    expected_quiet = balance_alerts(tmp_path, 'baton_balance_usd{instance="api-0"}', "40x10")
    assert expected_quiet.returncode == 0
    text = (tmp_path / "balance_test.yaml").read_text().replace("40x10", "1x10")
    (tmp_path / "balance_test.yaml").write_text(text)
    run = subprocess.run(
        [promtool(), "test", "rules", str(tmp_path / "balance_test.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode != 0


def test_the_dashboard_is_one_grafana_dashboard_over_a_chosen_datasource() -> None:
    """Unique panel ids, every query on the ``${datasource}`` variable, every alert with a
    severity and a summary."""
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert "datasource" in names
    for panel in dashboard["panels"]:
        for query in panel.get("targets", []):
            assert query["datasource"]["uid"] == "${datasource}", panel["title"]
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
            assert rule["annotations"]["summary"], rule["alert"]
