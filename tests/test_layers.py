"""Import direction: the packages form one-way layers (docs/architecture.md).

    muster (shared: API, quantities, logs, tracing)
      <- scheduling core: server minus server.service (model, session, plugins, actions, config,
         scheduler, simulate)
      <- server I/O: server.service (wire conversion and records, store, state, ingest, commands,
         snapshot, apply, loop, core_runner, observability <- api, rpc, dashboard, app, main)
    adapters and clients use only the shared package (the CLI's ``simulate --local`` also the core)

Every import statement counts, including those inside functions and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The pure scheduling core, by module name prefix.
CORE = (
    "server.model",
    "server.session",
    "server.plugins",
    "server.actions",
    "server.config",
    "server.scheduler",
    "server.simulate",
)
# The server's I/O: everything in server/ that is not the core.
SERVICE = ("server.service",)
# The top of server.service, the RPC-facing layer: nothing else in server.service imports it.
SERVICE_TOP = (
    "server.service.api",
    "server.service.rpc",
    "server.service.observability.dashboard",
    "server.service.app",
    "server.service.main",
)
# The wire conversion, below the state: it imports nothing else from server.service.
SERVICE_WIRE = tuple(
    f"server.service.{m}" for m in ("errors", "convert", "validate", "records", "views")
)
# Under ClusterState (server.service.state), which builds on them: its tables and rows in and out,
# the per-kind lifecycle rules it asks, and the backends' liveness books. They never import the
# state or what uses it.
SERVICE_UNDER_STATE = tuple(f"server.service.{m}" for m in ("tables", "lifecycle", "liveness"))
SERVICE_ON_STATE = tuple(
    f"server.service.{m}"
    for m in (
        "state",
        "ingest",
        "timelimits",
        "retention",
        "commands",
        "control",
        "snapshot",
        "apply",
        "loop",
        "replica",
        "core_runner",
        "observability",
    )
)
# What the core may import besides itself and the standard library.
CORE_THIRD_PARTY = (
    "numpy",
    "yaml",
    "structlog",
    "muster.quantity",
    "muster.devices",
    "muster.yamldoc",
    "muster.gang",
    "muster.display",
)
# Never in the core: the network, the API messages, the server's I/O, the edges.
CORE_FORBIDDEN = ("grpc", "google", "muster.v1", "opentelemetry", "anyio", "adapters", "clients")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module (absolute)
    line: int


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool = False) -> Iterator[Import]:
    """Every import in ``source`` (any depth), resolved to absolute module names."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                prefix = ".".join(base)
                target = f"{prefix}.{node.module}" if node.module else prefix
            else:
                target = node.module or ""
            # ``from server.plugins.volcano import gang`` imports the module server.plugins.volcano.gang
            for alias in node.names:
                yield Import(module, f"{target}.{alias.name}", node.lineno)


def project_imports(*packages: str) -> list[Import]:
    found: list[Import] = []
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "v1" in path.relative_to(ROOT).parts[:2] and package == "muster":
                continue  # generated code
            found.extend(
                imports_of(path.read_text(), module_name(path), path.name == "__init__.py")
            )
    return found


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def is_stdlib(name: str) -> bool:
    return name.split(".")[0] in sys.stdlib_module_names or name.split(".")[0] == "__future__"


def core_violations(imports: list[Import]) -> list[str]:
    bad = []
    for imp in imports:
        if not under(imp.module, CORE):
            continue
        target = imp.target
        if under(target, CORE) or is_stdlib(target) or under(target, CORE_THIRD_PARTY):
            continue
        # ``from muster.quantity import CPU`` resolves to muster.quantity.CPU: allowed above.
        bad.append(f"{imp.module}:{imp.line} imports {target}")
    return bad


def direction_violations(imports: list[Import]) -> list[str]:
    """Edges that run against the layers."""
    bad = []
    for imp in imports:
        m, t = imp.module, imp.target
        where = f"{m}:{imp.line} imports {t}"
        if (
            under(m, ("muster",))
            and under(t, ("server", "adapters", "clients"))
            or under(m, ("server",))
            and under(t, ("adapters", "clients"))
            or under(m, ("adapters",))
            and under(t, ("server", "clients"))
            or under(m, ("clients",))
            and under(t, ("adapters",))
        ):
            bad.append(where)
        elif under(m, ("clients",)) and under(t, ("server",)) and not under(t, CORE):
            bad.append(where)  # the CLI may run the core locally (simulate --local), nothing else
    return bad


def service_violations(imports: list[Import]) -> list[str]:
    """Inside server.service: only the top imports the top; the wire imports only the wire; the
    state's tables and lifecycle rules import nothing built on the state."""
    bad = []
    for imp in imports:
        m, t = imp.module, imp.target
        where = f"{m}:{imp.line} imports {t}"
        if not under(m, SERVICE) or not under(t, SERVICE):
            continue
        if (
            under(t, SERVICE_TOP)
            and not under(m, SERVICE_TOP)
            or under(m, SERVICE_WIRE)
            and not under(t, SERVICE_WIRE)
            or under(m, SERVICE_UNDER_STATE)
            and under(t, SERVICE_ON_STATE)
        ):
            bad.append(where)
    return bad


# KAI's actions share their machinery as KAI does (its actions/common): placing a job, the job queue
# through the queue hierarchy, the victim search.
KAI_ACTION_MACHINERY = (
    "server.actions.kai.common",
    "server.actions.kai.job_queue",
    "server.actions.kai.solver",
    "server.actions.kai.scenario_filters",
)


# Actions live in one sub-package per system they come from, as plugins do.
ACTION_FAMILIES = tuple(f"server.actions.{family}" for family in ("volcano", "kai", "muster"))


# Plugins live in one sub-package per system they come from; what they share is at the top.
PLUGIN_FAMILIES = tuple(
    f"server.plugins.{family}" for family in ("volcano", "kai", "tyarranger", "ascend", "muster")
)
PLUGIN_SHARED = ("server.plugins.base", "server.plugins.util")


def core_internal_violations(imports: list[Import]) -> list[str]:
    """Inside the core: the framework never imports plugins, actions or config parsing; a plugin
    imports no action and no other plugin; an action imports no plugin and no other action."""
    bad = []
    for imp in imports:
        m, t = imp.module, imp.target
        where = f"{m}:{imp.line} imports {t}"
        if under(m, ("server.session", "server.model")) and under(
            t,
            (
                "server.plugins",
                "server.actions",
                "server.config",
                "server.scheduler",
                "server.simulate",
            ),
        ):
            bad.append(where)
        elif under(m, ("server.plugins",)) and m != "server.plugins":
            # a family's package (``server.plugins.kai``) may gather its own members; a plugin module
            # imports only the shared helpers, never another plugin, of its family or another
            own = (m,) if m in PLUGIN_FAMILIES else ()
            if (
                under(t, ("server.actions", "server.config", "server.scheduler", "server.simulate"))
                or under(t, ("server.plugins",))
                and not under(t, (*PLUGIN_SHARED, *own))
            ):
                bad.append(where)
        elif (
            under(m, ("server.actions",))
            and m not in ("server.actions", *ACTION_FAMILIES)
            and (
                under(t, ("server.plugins", "server.config", "server.scheduler", "server.simulate"))
                or (
                    under(t, ("server.actions",))
                    and not under(t, ("server.actions.base", *KAI_ACTION_MACHINERY))
                )
            )
        ):
            bad.append(where)
    return bad


ALL = ("muster", "server", "adapters", "clients")


def test_core_imports_only_itself_the_standard_library_numpy_yaml_and_quantities() -> None:
    assert core_violations(project_imports("server")) == []


def test_packages_import_one_way() -> None:
    assert direction_violations(project_imports(*ALL)) == []


def test_inside_the_core_framework_plugins_and_actions_import_one_way() -> None:
    assert core_internal_violations(project_imports("server")) == []


def test_inside_the_server_io_the_rpc_layer_is_on_top_and_the_wire_at_the_bottom() -> None:
    assert service_violations(project_imports("server")) == []


def test_every_server_module_is_core_or_io() -> None:
    """server/ holds the core and one I/O package, nothing beside them."""
    modules = {module_name(p) for p in (ROOT / "server").rglob("*.py")} - {"server"}
    assert sorted(m for m in modules if not under(m, CORE) and not under(m, SERVICE)) == []


def test_importing_the_core_loads_no_network_api_or_server_io() -> None:
    """At run time too (a static check can miss an import by ``importlib``)."""
    code = (
        "import sys, server.scheduler, server.simulate, server.config\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google', 'opentelemetry', 'anyio',"
        " 'adapters', 'clients') or m.startswith('muster.v1') or (m.startswith('server.') and not m.startswith("
        f"{CORE!r})))\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("module", "source", "checker"),
    [
        (
            "server.plugins.volcano.gang",
            "from server.actions.victims import victims_queue",
            core_internal_violations,
        ),
        (
            "server.plugins.volcano.drf",
            "def f():\n    from server.plugins.volcano.proportion import x\n",
            core_internal_violations,
        ),
        (
            "server.plugins.volcano.gang",
            "from server.plugins.kai.elastic import x",
            core_internal_violations,
        ),
        (
            "server.plugins.kai.gpupack",
            "from server.plugins.volcano import binpack",
            core_internal_violations,
        ),
        (
            "server.plugins.volcano",
            "from server.plugins.kai import gpupack",
            core_internal_violations,
        ),
        ("server.session.session", "from server.plugins import PLUGINS", core_internal_violations),
        ("server.actions.volcano.allocate", "from . import preempt", core_internal_violations),
        ("server.session.info", "import grpc", core_violations),
        (
            "server.plugins.volcano.gang",
            "from server.service.state import ClusterState",
            core_violations,
        ),
        ("server.scheduler", "from server.service import errors", core_violations),
        (
            "server.session.session",
            "def f():\n    import server.service.convert\n",
            core_violations,
        ),
        ("server.model", "from muster.v1 import muster_pb2", core_violations),
        ("adapters.k8s.adapter", "from server.service import convert", direction_violations),
        ("clients.cli", "from server.service.app import ServerOptions", direction_violations),
        ("muster.quantity", "from server import model", direction_violations),
        ("server.service.state", "from adapters.runtime import x", direction_violations),
        (
            "server.service.state",
            "from server.service.api.queries import list_queues",
            service_violations,
        ),
        ("server.service.records", "from server.service.api import views", service_violations),
        (
            "server.service.loop",
            "from server.service.rpc import SchedulerService",
            service_violations,
        ),
        ("server.service.commands", "from server.service import app", service_violations),
        (
            "server.service.observability.history",
            "from server.service.observability import dashboard",
            service_violations,
        ),
        (
            "server.service.convert",
            "from server.service.state import ClusterState",
            service_violations,
        ),
        ("server.service.records", "from server.service import store", service_violations),
        ("server.service.views", "from . import decisions", service_violations),
        (
            "server.service.lifecycle",
            "from server.service.state import PLACED",
            service_violations,
        ),
        ("server.service.tables", "from server.service import ingest", service_violations),
    ],
)
def test_the_checks_catch_a_wrong_import(module: str, source: str, checker: object) -> None:
    is_package = module in ("server.plugins", *PLUGIN_FAMILIES)
    found = list(imports_of(source, module, is_package))
    assert checker(found), f"{module}: {source!r} should be a violation"  # type: ignore[operator]


def test_the_checks_allow_the_intended_imports() -> None:
    allowed = [
        ("server.plugins.volcano.gang", "from server.session.session import Session"),
        (
            "server.plugins.volcano.drf",
            "from server.plugins.util import x\nfrom muster.quantity import CPU",
        ),
        ("server.plugins.kai.gpupack", "from server.plugins.base import Plugin"),
        ("server.plugins.kai", "from server.plugins.kai.elastic import ElasticPlugin"),
        (
            "server.actions.volcano.allocate",
            "from server.actions.base import Action\nimport numpy as np",
        ),
        (
            "server.service.state",
            "from muster.v1 import muster_pb2 as pb\nfrom server.model import TaskStatus",
        ),
        (
            "server.service.state",
            "from server.service import convert\nfrom server.service.records import JobRecord",
        ),
        (
            "server.service.views",
            "from server.service.convert import timestamp\nfrom . import records",
        ),
        (
            "server.service.rpc",
            "from server.service.api import queries\nfrom server.service.state import ClusterState",
        ),
        ("server.service.app", "from server.service.rpc import SchedulerService"),
        (
            "server.service.state",
            "from server.service.tables import StateTables\nfrom . import lifecycle",
        ),
        ("server.service.lifecycle", "from server.service.records import JobRecord"),
        ("server.service.observability.dashboard", "from server.service.api import queries"),
        ("clients.cli", "from server.simulate import simulate_text"),
        ("adapters.runtime", "from muster.tracing import extract"),
    ]
    for module, source in allowed:
        found = list(imports_of(source, module))
        assert not core_violations(found), (module, source)
        assert not direction_violations(found), (module, source)
        assert not core_internal_violations(found), (module, source)
        assert not service_violations(found), (module, source)
