"""Getting Muster: the Dockerfile builds what pyproject packages, the manifests and the Helm chart run
that image with the same settings, and `make install` puts the commands on PATH."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "muster"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
IMAGE = f"ghcr.io/muster-sched/muster:{VERSION}"


def manifests() -> list[dict]:
    return [
        d
        for f in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
        for d in yaml.safe_load_all(f.read_text())
        if d
    ]


def test_dockerfile_copies_every_package_and_runs_as_the_manifests_user() -> None:
    text = (ROOT / "Dockerfile").read_text()
    for package in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]:
        assert f"COPY {package.rstrip('*')} " in text, package
    assert "USER 65532" in text
    assert "--uid 65532" in text
    for script in PYPROJECT["project"][
        "scripts"
    ]:  # every entry point is in the image (pip install .)
        assert script.startswith("muster")


def test_manifests_run_the_image_over_tls() -> None:
    deployments = [d for d in manifests() if d["kind"] == "Deployment"]
    for d in deployments:
        [container] = d["spec"]["template"]["spec"]["containers"]
        assert container["image"] == IMAGE
        assert d["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 65532
        args = container["args"]
        assert "--insecure" not in args  # off loopback: TLS (the server refuses plaintext there)
        assert any(a.startswith("--tls-") for a in args), d["metadata"]["name"]


def test_helm_chart_matches_the_manifests() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart["appVersion"] == VERSION
    assert f"{values['image']['repository']}:{values['image']['tag']}" == IMAGE
    # The adapter's RBAC rules are the manifests' (one list, kept equal).
    role = next(d for d in manifests() if d["kind"] == "ClusterRole")
    assert yaml.safe_load((CHART / "files" / "adapter-rules.yaml").read_text()) == role["rules"]
    # Every value a template reads exists.
    for template in (CHART / "templates").glob("*"):
        for path in re.findall(r"\.Values\.([A-Za-z0-9_.]+)", template.read_text()):
            node = values
            for key in path.split("."):
                assert isinstance(node, dict), (
                    f"{template.name}: .Values.{path} is not in values.yaml"
                )
                assert key in node, f"{template.name}: .Values.{path} is not in values.yaml"
                node = node[key]
    # The chart's scheduler configuration is a valid one.
    from server.config import load_config

    load_config(values["server"]["schedulerConfig"])


@pytest.mark.skipif(shutil.which("helm") is None, reason="helm is not installed")
def test_helm_template_renders_the_objects() -> None:
    out = subprocess.run(
        ["helm", "template", "muster", str(CHART), "--namespace", "muster-system"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(out) if d)
    assert kinds.count("Deployment") == 2
    assert "ClusterRole" in kinds
    assert "ConfigMap" in kinds


def test_make_install_links_the_commands(tmp_path: Path) -> None:
    if shutil.which("make") is None or not (ROOT / ".venv" / ".installed").exists():
        pytest.skip("needs make and the project's venv")
    subprocess.run(
        ["make", "-s", "install", f"PREFIX={tmp_path}"], cwd=ROOT, check=True, capture_output=True
    )
    version = subprocess.run(
        [str(tmp_path / "bin" / "muster"), "--version"], check=True, capture_output=True, text=True
    )
    assert version.stdout.strip() == f"muster {VERSION}"
    for cmd in ("muster-server", "muster-agent", "muster-k8s-adapter", "muster-slurm-adapter"):
        assert (tmp_path / "bin" / cmd).exists()
