"""The Prometheus + Grafana provisioning of the compose `monitoring` profile: well-formed, wired to
each other, and every panel's PromQL names metrics (and labels) that the bridges and nodes export."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from nats.aio.client import Client

from broker.http_bridge import HttpBridge
from nodes.metrics import NodeMetrics

MONITORING = Path(__file__).resolve().parents[2] / "compose" / "monitoring"
GRAFANA = MONITORING / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "p2pfaas.json"
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"), "gauge": ("",)}
TARGET_LABELS = {"instance", "job"}     # Prometheus adds these to every scraped sample
METRIC_RE = re.compile(r"\b(p2pfaas_[a-z0-9_]+)\b")
SELECTOR_RE = re.compile(r"\b(p2pfaas_[a-z0-9_]+)\{([^}]*)\}")
MATCHER_RE = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)\s*\"")
GROUPING_RE = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def exported() -> dict[str, set[str]]:
    """Sample name -> its label names, for every metric of the HTTP bridge and of a node."""
    registries = [HttpBridge(Client(), "n1").registry, NodeMetrics("n1").registry]
    out: dict[str, set[str]] = {}
    for registry in registries:
        for collector in registry._collector_to_names:
            for suffix in SUFFIXES[collector._type]:
                labels = set(collector._labelnames) | ({"le"} if suffix == "_bucket" else set())
                out[collector._name + suffix] = labels
    return out


def panels() -> list[dict]:
    return json.loads(DASHBOARD.read_text())["panels"]


def queries() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in panels() if p["type"] != "row" for t in p["targets"]]


def test_prometheus_scrapes_the_bridges_metrics():
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    targets = [t for group in job["static_configs"] for t in group["targets"]]
    assert targets and all(re.fullmatch(r"[\w.-]+:\d+", t) for t in targets)


def test_grafana_provisioning_points_at_the_dashboard_and_prometheus():
    datasources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["url"].startswith("http://prometheus:9090")
    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "p2pfaas.yml").read_text())
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"] == "/var/lib/grafana/dashboards"
    dashboard = json.loads(DASHBOARD.read_text())
    used = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p.get("targets", [])}
    used |= {v["datasource"]["uid"] for v in dashboard["templating"]["list"]}
    assert used == {source["uid"]}


def test_dashboard_layout_is_well_formed():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]
        area = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not area & cells, f"panel {panel['title']!r} overlaps another"
        cells |= area
        if panel["type"] != "row":
            refs = [t["refId"] for t in panel["targets"]]
            assert refs and len(refs) == len(set(refs)) and all(t["expr"].strip() for t in panel["targets"])
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    for title, expr in queries():
        assert set(re.findall(r"\$(\w+)", expr)) <= variables, title
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), title


@pytest.mark.parametrize("title,expr", queries())
def test_every_query_names_exported_metrics_and_labels(title, expr):
    metrics = exported()
    names = set(METRIC_RE.findall(expr))
    assert names, f"{title}: no p2pfaas metric in {expr}"
    assert names <= set(metrics), f"{title}: unknown metric(s) {names - set(metrics)}"
    for name, matchers in SELECTOR_RE.findall(expr):
        for label in MATCHER_RE.findall(matchers):
            assert label in metrics[name] | TARGET_LABELS, f"{title}: {name} has no label {label!r}"
    available = set.union(*(metrics[name] for name in names)) | TARGET_LABELS
    for grouping in GROUPING_RE.findall(expr):
        labels = {label.strip() for label in grouping.split(",") if label.strip()}
        assert labels <= available, f"{title}: grouping by unknown label(s) {labels - available}"


def test_the_node_variable_reads_an_exported_label():
    (variable,) = json.loads(DASHBOARD.read_text())["templating"]["list"]
    metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["definition"]).groups()
    assert label in exported()[metric]
