"""The Grafana dashboard and the Prometheus alert rules name only metrics the workers
export: a renamed metric would otherwise leave an empty panel or an alert that never fires."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.cluster import scrape
from tests.support.pipeline import Pipeline
from tests.support.workers import ROOT, Worker

DASHBOARD = ROOT / "deploy" / "grafana" / "agent-context.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
_METRIC = re.compile(r"\b(ac_[a-z_]+?)(?:_bucket|_count|_sum)?\b")


def named_metrics() -> set[str]:
    exprs = [
        target["expr"]
        for panel in json.loads(DASHBOARD.read_text())["panels"]
        for target in panel["targets"]
    ]
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    exprs += [rule["expr"] for rule in rules]
    return {m for expr in exprs for m in _METRIC.findall(expr)}


def test_the_alert_rules_are_valid_where_promtool_is_installed() -> None:
    rules = yaml.safe_load(ALERTS.read_text())["groups"][0]["rules"]
    assert all({"alert", "expr", "annotations"} <= rule.keys() for rule in rules)
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed here: only the rules' shape was checked")
    done = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.kafka
async def test_every_metric_the_dashboard_and_alerts_name_is_exported(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    pipe = Pipeline(worker_env, tmp_path, workers)
    started = [pipe.start_pipeline(), pipe.start_sink("files")]
    await asyncio.gather(*(w.wait_ready() for w in started))
    exported = set()
    for worker in started:
        exported |= set(re.findall(r"^# TYPE (\S+)", await scrape(worker.url), re.M))
    wanted = named_metrics()
    assert len(wanted) >= 15
    assert wanted <= exported, sorted(wanted - exported)
