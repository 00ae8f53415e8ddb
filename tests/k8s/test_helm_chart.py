"""The Helm chart rendered (tests/k8s/helm_render.py; the real helm where it is installed): the
server's replicas follow its state backend, never two on one SQLite file; replicas get a
disruption budget, anti-affinity, their own advertised address and a gRPC readiness probe; the
adapter runs two replicas under leader election with the RBAC its Lease needs; the chart's
defaults are the plain manifests' objects; and the probe command the chart runs works against a
real server over mutual TLS."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from security.tls_helpers import Authority

from server.service.app import ServerOptions, start_server

from .helm_render import ChartFail, TemplateError, render_chart

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "muster"
POSTGRES = {"server": {"state": {"postgres": {"dsnSecret": {"name": "muster-postgres"}}}}}


def render(*overrides: dict[str, Any]) -> list[dict[str, Any]]:
    values: dict[str, Any] = {}
    for o in overrides:
        values = _merge(values, o)
    return render_chart(CHART, values)


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def get(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any] | None:
    return next((o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name), None)


def container(objects: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    d = get(objects, "Deployment", deployment)
    assert d is not None
    [c] = d["spec"]["template"]["spec"]["containers"]
    return c


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def manifests() -> list[dict[str, Any]]:
    return [
        d
        for f in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
        for d in yaml.safe_load_all(f.read_text())
        if d and f.name != "kustomization.yaml"
    ]


# ------------------------------------------------------------------------------------------ server


def test_default_is_one_server_on_the_sqlite_file() -> None:
    objs = render()
    server = get(objs, "Deployment", "muster-server")
    assert server is not None
    assert server["spec"]["replicas"] == 1
    assert server["spec"]["strategy"] == {"type": "Recreate"}
    assert get(objs, "PersistentVolumeClaim", "muster-state") is not None
    args = container(objs, "muster-server")["args"]
    assert flag(args, "--state") == "/var/lib/muster/muster.db"
    assert "--advertise" not in args
    volumes = server["spec"]["template"]["spec"]["volumes"]
    assert {"name": "state", "persistentVolumeClaim": {"claimName": "muster-state"}} in volumes
    for kind, name in (
        ("PodDisruptionBudget", "muster-server"),
        ("Service", "muster-server-peers"),
    ):
        assert get(objs, kind, name) is None
    assert "affinity" not in server["spec"]["template"]["spec"]


@pytest.mark.parametrize("replicas", [2, 3])
def test_several_servers_on_one_sqlite_file_are_refused(replicas: int) -> None:
    with pytest.raises(ChartFail, match="SQLite") as err:
        render({"server": {"replicaCount": replicas}})
    assert f"server.replicaCount={replicas}" in str(err.value)
    assert "server.state.postgres.dsnSecret.name" in str(err.value)


def test_postgres_runs_three_replicas_with_the_dsn_from_a_secret() -> None:
    objs = render(POSTGRES)
    server = get(objs, "Deployment", "muster-server")
    assert server is not None
    assert server["spec"]["replicas"] == 3
    assert server["spec"]["strategy"]["type"] == "RollingUpdate"
    assert get(objs, "PersistentVolumeClaim", "muster-state") is None
    pod = server["spec"]["template"]["spec"]
    c = container(objs, "muster-server")
    env = {e["name"]: e for e in c["env"]}
    # The DSN reaches --state through an env var from the Secret; it is in no value or object.
    state = flag(c["args"], "--state")
    assert state is not None
    assert state.startswith("$(")
    assert state.endswith(")")
    assert env[state[2:-1]]["valueFrom"] == {
        "secretKeyRef": {"name": "muster-postgres", "key": "dsn"}
    }
    assert "value" not in env[state[2:-1]]
    # Each pod advertises its own address, from the downward API.
    assert flag(c["args"], "--advertise") == "$(POD_IP):50051"
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert not any(m["name"] == "state" for m in c["volumeMounts"])
    assert not any(v["name"] == "state" for v in pod["volumes"])
    # Spread over nodes (preferred), one down at a time.
    [term] = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    labels = server["spec"]["template"]["metadata"]["labels"]
    selector = term["podAffinityTerm"]["labelSelector"]["matchLabels"]
    assert selector.items() <= labels.items()
    pdb = get(objs, "PodDisruptionBudget", "muster-server")
    assert pdb is not None
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # Clients' Service covers every replica; the headless one gives the pod addresses.
    for name in ("muster-server", "muster-server-peers"):
        svc = get(objs, "Service", name)
        assert svc is not None
        assert svc["spec"]["selector"].items() <= labels.items()
        assert svc["spec"]["ports"][0]["port"] == 50051
    peers = get(objs, "Service", "muster-server-peers")
    assert peers is not None
    assert peers["spec"]["clusterIP"] == "None"


def test_postgres_replica_count_can_be_set() -> None:
    objs = render(POSTGRES, {"server": {"replicaCount": 5}})
    server = get(objs, "Deployment", "muster-server")
    assert server is not None
    assert server["spec"]["replicas"] == 5
    objs = render(POSTGRES, {"server": {"replicaCount": 1}})
    server = get(objs, "Deployment", "muster-server")
    assert server is not None
    assert server["spec"]["replicas"] == 1
    assert get(objs, "PodDisruptionBudget", "muster-server") is None  # 1 of 1 could never go


def test_postgres_dsn_key_is_required() -> None:
    with pytest.raises(ChartFail, match="dsnSecret.key"):
        render(POSTGRES, {"server": {"state": {"postgres": {"dsnSecret": {"key": ""}}}}})


def test_readiness_is_grpc_health_over_mutual_tls_unless_replaced() -> None:
    for objs in (render(), render(POSTGRES)):
        c = container(objs, "muster-server")
        command = c["readinessProbe"]["exec"]["command"]
        assert command[:3] == ["python", "-m", "adapters.k8s.probe"]
        mounted = {m["mountPath"] for m in c["volumeMounts"]}
        for name in ("--tls-ca", "--tls-cert", "--tls-key"):
            path = flag(command, name)
            assert path is not None
            assert str(Path(path).parent) in mounted
        # The server's own certificate and key: the ones it serves.
        assert flag(command, "--tls-cert") == flag(c["args"], "--tls-cert")
        assert flag(command, "--tls-key") == flag(c["args"], "--tls-key")
        assert flag(command, "--tls-server-name") == "muster-server.muster-system.svc"
    own = {"tcpSocket": {"port": 50051}, "periodSeconds": 3}
    c = container(render({"server": {"readinessProbe": own}}), "muster-server")
    assert c["readinessProbe"] == own


async def test_the_charts_probe_command_checks_a_real_server(tmp_path: Path) -> None:
    """The readiness command as the chart renders it, files mapped to a throwaway CA's, against
    the real server serving mutual TLS: 0 while it serves, 1 once it is gone."""
    ca = Authority.new("muster-ca")
    cert, key = ca.issue(
        "muster-server", tmp_path, server=False, dns_names=("muster-server.muster-system.svc",)
    )
    files = {
        "/etc/muster/tls/ca.crt": str(ca.write(tmp_path / "ca.crt")),
        "/etc/muster/tls/tls.crt": str(cert),
        "/etc/muster/tls/tls.key": str(key),
    }
    handle = await start_server(
        ServerOptions(
            listen="127.0.0.1:0",
            state=str(tmp_path / "muster.db"),
            cycle_period=3600.0,
            tls_cert=str(cert),
            tls_key=str(key),
            tls_client_ca=files["/etc/muster/tls/ca.crt"],
        )
    )
    command = container(render(), "muster-server")["readinessProbe"]["exec"]["command"]
    argv = [files.get(a, a) for a in command]
    argv[argv.index("--server") + 1] = f"127.0.0.1:{handle.port}"
    assert argv[0] == "python"
    argv[0] = sys.executable

    async def probe() -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(*argv, cwd=ROOT, stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode is not None
        return proc.returncode, err.decode()

    try:
        assert await probe() == (0, "")
    finally:
        await handle.stop()
    code, err = await probe()
    assert code == 1
    assert "is not serving: UNAVAILABLE" in err


# ------------------------------------------------------------------------------------------ adapter


def test_adapter_runs_two_replicas_under_leader_election() -> None:
    objs = render()
    adapter = get(objs, "Deployment", "muster-k8s-adapter")
    assert adapter is not None
    assert adapter["spec"]["replicas"] == 2
    assert adapter["spec"]["strategy"]["type"] == "RollingUpdate"
    c = container(objs, "muster-k8s-adapter")
    args = c["args"]
    assert "--no-leader-elect" not in args
    assert flag(args, "--lease-name") == "muster-k8s-adapter-kubernetes"
    assert flag(args, "--lease-namespace") == "muster-system"
    assert [flag(args, f) for f in ("--lease-duration", "--renew-deadline", "--retry-period")] == [
        "15",
        "10",
        "2",
    ]
    assert flag(args, "--tls-server-name") == "muster-server.muster-system.svc"
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    # The Role lets it get, create and update its Lease, in its namespace only.
    role = get(objs, "Role", "muster-k8s-adapter-leader-election")
    binding = get(objs, "RoleBinding", "muster-k8s-adapter-leader-election")
    assert role is not None
    assert binding is not None
    assert role["metadata"]["namespace"] == "muster-system"
    verbs = {
        v for r in role["rules"] if r["apiGroups"] == ["coordination.k8s.io"] for v in r["verbs"]
    }
    assert verbs == {"get", "create", "update"}
    for rule in role["rules"]:
        if "get" in rule["verbs"]:
            assert rule["resourceNames"] == ["muster-k8s-adapter-kubernetes"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "muster-k8s-adapter", "namespace": "muster-system"}
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    pdb = get(objs, "PodDisruptionBudget", "muster-k8s-adapter")
    assert pdb is not None
    assert pdb["spec"]["maxUnavailable"] == 1


def test_lease_name_follows_the_backend_name_or_the_value() -> None:
    objs = render({"adapter": {"backendName": "gpu"}})
    role = get(objs, "Role", "muster-k8s-adapter-leader-election")
    assert role is not None
    assert flag(container(objs, "muster-k8s-adapter")["args"], "--lease-name") == (
        "muster-k8s-adapter-gpu"
    )
    assert ["muster-k8s-adapter-gpu"] in [r.get("resourceNames") for r in role["rules"]]
    objs = render({"adapter": {"leaderElection": {"leaseName": "mine"}}})
    assert flag(container(objs, "muster-k8s-adapter")["args"], "--lease-name") == "mine"


def test_adapter_without_leader_election_is_one_replica_or_refused() -> None:
    with pytest.raises(ChartFail, match="leaderElection"):
        render({"adapter": {"leaderElection": {"enabled": False}}})  # 2 replicas by default
    objs = render({"adapter": {"replicaCount": 1, "leaderElection": {"enabled": False}}})
    adapter = get(objs, "Deployment", "muster-k8s-adapter")
    assert adapter is not None
    assert adapter["spec"]["strategy"] == {"type": "Recreate"}
    assert "--no-leader-elect" in container(objs, "muster-k8s-adapter")["args"]
    assert get(objs, "Role", "muster-k8s-adapter-leader-election") is None


# ------------------------------------------------------------------------------------------ chart


def test_chart_defaults_are_the_manifests() -> None:
    """deploy/kubernetes is the chart's default rendering written out: same pods, same RBAC."""
    objs, plain = render(), manifests()
    for name in ("muster-server", "muster-k8s-adapter"):
        rendered, written = get(objs, "Deployment", name), get(plain, "Deployment", name)
        assert rendered is not None
        assert written is not None
        assert rendered["spec"]["replicas"] == written["spec"]["replicas"], name
        assert rendered["spec"]["strategy"] == written["spec"]["strategy"], name
        pod, pod_written = rendered["spec"]["template"]["spec"], written["spec"]["template"]["spec"]
        assert pod.get("affinity") == pod_written.get("affinity"), name
        [c], [cw] = pod["containers"], pod_written["containers"]
        for key in ("args", "env", "readinessProbe", "livenessProbe", "volumeMounts"):
            assert c.get(key) == cw.get(key), (name, key)
    for kind, name in (
        ("Role", "muster-k8s-adapter-leader-election"),
        ("RoleBinding", "muster-k8s-adapter-leader-election"),
        ("PodDisruptionBudget", "muster-k8s-adapter"),
    ):
        rendered, written = get(objs, kind, name), get(plain, kind, name)
        assert rendered is not None, (kind, name)
        assert written is not None, (kind, name)
        for key in ("rules", "roleRef", "subjects", "spec"):
            assert rendered.get(key) == written.get(key), (kind, name, key)


def test_the_renderer_refuses_what_it_does_not_know(tmp_path: Path) -> None:
    """It must not pass a chart that helm would render differently or refuse."""
    (tmp_path / "templates").mkdir()
    (tmp_path / "Chart.yaml").write_text("name: t\nversion: 0.1.0\n")
    (tmp_path / "values.yaml").write_text("n: 3\nm: {a: 1}\n")
    for template in (
        "{{ range .Values.m }}x{{ end }}",
        "{{ if gt .Values.n 1 }}x{{ end }}",  # float64 against int: helm refuses it too
        "{{ upper .Values.n }}",
        "{{ .Values.missing.deeper }}",
        "a: 1\na: 2\n",
    ):
        (tmp_path / "templates" / "t.yaml").write_text(template)
        with pytest.raises(TemplateError):
            render_chart(tmp_path)
    (tmp_path / "templates" / "t.yaml").write_text(
        "{{- $n := int .Values.n }}\nv: {{ if gt $n 1 -}} big {{- else }} small{{ end }}\n"
        'w: {{ .Values.missing | default (printf "%s-%d" "x" $n) | quote }}\n'
    )
    assert render_chart(tmp_path) == [{"v": "big", "w": "x-3"}]


@pytest.mark.skipif(shutil.which("helm") is None, reason="helm is not installed")
@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["server.state.postgres.dsnSecret.name=muster-postgres"],
        ["adapter.replicaCount=1", "adapter.leaderElection.enabled=false"],
    ],
)
def test_helm_renders_what_the_test_renderer_renders(sets: list[str]) -> None:
    argv = ["helm", "template", "muster", str(CHART), "--namespace", "muster-system"]
    for s in sets:
        argv += ["--set", s]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    overrides: dict[str, Any] = {}
    for s in sets:
        path, _, raw = s.partition("=")
        node = overrides
        *parents, leaf = path.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = yaml.safe_load(raw)
    key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
    helm = sorted((d for d in yaml.safe_load_all(out) if d), key=key)
    assert helm == sorted(render_chart(CHART, overrides), key=key)


@pytest.mark.skipif(shutil.which("helm") is None, reason="helm is not installed")
def test_helm_refuses_replicas_on_sqlite() -> None:
    run = subprocess.run(
        ["helm", "template", "muster", str(CHART), "--set", "server.replicaCount=2"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode != 0
    assert "SQLite" in run.stderr


def test_two_releases_in_one_namespace_share_no_object_and_select_only_their_own_pods() -> None:
    """Helm installs a chart twice in one namespace under two release names: every object name,
    Lease and selector must be the release's own, and each adapter must talk to its own server."""
    first = render_chart(CHART, POSTGRES, name="team-a")
    second = render_chart(CHART, POSTGRES, name="team-b")

    def names(objs: list[dict[str, Any]]) -> set[tuple[str, str]]:
        return {(o["kind"], o["metadata"]["name"]) for o in objs}

    assert names(first).isdisjoint(names(second))
    assert get(first, "Deployment", "team-a-muster-server") is not None
    for objs, release in ((first, "team-a"), (second, "team-b")):
        for d in (o for o in objs if o["kind"] in ("Deployment", "PodDisruptionBudget")):
            selector = d["spec"]["selector"]["matchLabels"]
            assert selector["app.kubernetes.io/instance"] == release, d["metadata"]["name"]
        for s in (o for o in objs if o["kind"] == "Service"):
            assert s["spec"]["selector"]["app.kubernetes.io/instance"] == release
        args = container(objs, f"{release}-muster-k8s-adapter")["args"]
        assert flag(args, "--server") == f"{release}-muster-server.muster-system.svc:50051"
        assert flag(args, "--lease-name") == f"{release}-muster-k8s-adapter-kubernetes"
    # A release whose name already says muster is not doubled.
    assert get(render_chart(CHART, name="muster-prod"), "Deployment", "muster-prod-server")
