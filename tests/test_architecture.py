"""The app's architecture as docs/architecture.md states it: which room may import which,
no import cycle, no module over 450 lines, the task names a beat schedule holds, and the
public surface a host may import (the demo project imports nothing else)."""

from __future__ import annotations

import ast
import importlib
import re
from functools import cache
from pathlib import Path

import pytest

import webhook_receiver
from webhook_receiver import tasks  # noqa: F401 (registers the tasks)

APP = Path(webhook_receiver.__file__).resolve().parent
ROOT = APP.parent
NAME = "webhook_receiver"
MAX_LINES = 450
TASKS = {
    "retry_failed_events",
    "purge_audit_records",
    "purge_receipts",
    "purge_failed_events",
    "relay_destination",
    "relay_sweep",
    "purge_outbox",
    "reconcile_sources",
    "beat_heartbeat",
    "check_silence",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def app_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for path in APP.rglob("*.py")
        if "migrations" not in path.relative_to(APP).parts
    }


def _allowed_lazily(module: str, function: str) -> bool:
    """The lazy imports the rules allow: a task's service, inside its body; the system
    checks, in the app config's ready()."""
    return module == f"{NAME}.tasks" or (module == f"{NAME}.apps" and function == "ready")


def imported(module: str, path: Path) -> set[str]:
    """The app modules ``module`` imports, at its top, inside a function or under ``if
    TYPE_CHECKING:`` (a type-only import is still a dependency), but the allowed lazy
    imports."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = function
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = child.name
            lazy_ok = function is not None and _allowed_lazily(module, function)
            if isinstance(child, ast.ImportFrom) and not lazy_ok:
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                for alias in child.names:
                    candidate = f"{base}.{alias.name}"
                    found.add(candidate if candidate in app_modules() else base)
            elif isinstance(child, ast.Import) and not lazy_ok:
                found.update(alias.name for alias in child.names)
            visit(child, inner)

    visit(tree, None)
    return {name for name in found if name == NAME or name.startswith(f"{NAME}.")}


@cache
def graph() -> dict[str, set[str]]:
    return {module: imported(module, path) for module, path in app_modules().items()}


def room(module: str) -> str:
    """The first part under the app: "inbound", "core", "tasks"…"""
    return module.removeprefix(f"{NAME}.").split(".")[0] if module != NAME else ""


def imports_of(*rooms: str) -> list[tuple[str, str]]:
    return [(m, target) for m, targets in graph().items() if room(m) in rooms for target in targets]


def test_the_import_graph_has_no_cycle():
    # a depth-first search that reports the first cycle it meets, whole
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(module: str) -> list[str] | None:
        state[module] = 1
        stack.append(module)
        for target in sorted(graph().get(module, ())):
            if target not in graph():
                continue
            if state.get(target) == 1:
                return stack[stack.index(target) :] + [target]
            if target not in state and (cycle := walk(target)):
                return cycle
        stack.pop()
        state[module] = 2
        return None

    for module in sorted(graph()):
        if module not in state and (cycle := walk(module)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def test_the_core_imports_no_room():
    allowed = {"core", "conf", "exceptions", "schemes"}
    wrong = [(m, t) for m, t in imports_of("core") if room(t) not in allowed]
    assert wrong == []


def test_the_network_and_presentation_import_only_the_core_and_below():
    # the two rooms beside the core: what reaches peers, and what people read
    allowed = {"core", "conf", "exceptions", "schemes"}
    wrong = [(m, t) for m, t in imports_of("network") if room(t) not in allowed | {"network"}]
    shown = imports_of("presentation")
    wrong += [(m, t) for m, t in shown if room(t) not in allowed | {"presentation"}]
    assert wrong == []


def test_the_lowest_layers_import_only_what_is_below_them():
    below = {"exceptions": set(), "signals": set(), "schemes": {"exceptions", "schemes"}}
    below["conf"] = {"conf", "schemes", "exceptions"}
    wrong = [
        (m, t)
        for layer, allowed in below.items()
        for m, t in imports_of(layer)
        if room(t) not in allowed
    ]
    assert wrong == []


def test_inbound_and_outbound_never_import_each_other_nor_what_reads_them():
    readers = {"watch", "reconcile", "admin", "management", "checks", "urls", "models"}
    readers |= {"evaluation"}
    wrong = [
        (m, t)
        for m, t in imports_of("inbound", "outbound")
        if room(t) in readers | ({"outbound"} if room(m) == "inbound" else {"inbound"})
    ]
    assert wrong == []


def test_only_the_host_facing_rooms_import_the_portal():
    readers = {"portal", "admin", "management", "urls", "models", "tasks"}
    assert [
        (m, t) for m, t in graph_edges() if room(t) == "portal" and room(m) not in readers
    ] == []


def test_the_portals_pages_and_api_reach_records_only_through_the_scoped_layer():
    # a tenant's records are read through actions.py (the session's scope), never a manager
    shown = [p for name, p in app_modules().items() if name.startswith(f"{NAME}.portal.")]
    shown = [p for p in shown if "pages" in p.parts or "api" in p.parts or p.stem == "actions"]
    managers = [
        f"{path.relative_to(APP)}:{node.lineno}"
        for path in shown
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in ("objects", "_default_manager")
    ]
    assert shown and managers == []


def graph_edges() -> list[tuple[str, str]]:
    return [(m, t) for m, targets in graph().items() for t in targets]


def test_sources_read_only_the_layers_below():
    # receiving never reaches sending: the encryption of stored secrets is the core's
    allowed = {"conf", "core", "network", "presentation", "schemes", "exceptions", "sources"}
    wrong = [(m, t) for m, t in imports_of("sources") if room(t) not in allowed]
    assert wrong == []


def test_reconcile_reads_inbound_and_nothing_above_it():
    wrong = [
        (m, t)
        for m, t in imports_of("reconcile")
        if room(t) in {"outbound", "watch", "admin", "management", "models"}
    ]
    assert wrong == []


def test_watch_never_imports_the_admin_nor_the_aggregate_models_module():
    wrong = [(m, t) for m, t in imports_of("watch") if room(t) in {"admin", "management"}]
    wrong += [(m, t) for m, t in imports_of("watch") if t == f"{NAME}.models"]
    assert wrong == []


def test_the_evaluation_reads_the_rooms_and_only_its_command_reads_it():
    # webhook_eval drives the real code from outside: nothing of the app depends on it
    wrong = [(m, t) for m, t in imports_of("evaluation") if room(t) in {"admin", "reconcile"}]
    wrong += [
        (m, t)
        for m, targets in graph().items()
        for t in targets
        if room(t) == "evaluation"
        and room(m) != "evaluation"
        and m != f"{NAME}.management.commands.webhook_eval"
    ]
    assert wrong == []


def test_nothing_imports_the_admin_but_the_admin():
    wrong = [(m, t) for m, targets in graph().items() for t in targets]
    assert [(m, t) for m, t in wrong if room(t) == "admin" and room(m) != "admin"] == []


def test_the_app_never_imports_the_demo_project_or_the_tests():
    for module, path in app_modules().items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                assert name.split(".")[0] not in {"project", "tests"}, (module, name)


def test_no_module_is_over_450_lines():
    long = {
        module: len(path.read_text().splitlines())
        for module, path in app_modules().items()
        if len(path.read_text().splitlines()) > MAX_LINES
    }
    assert long == {}


def test_the_tasks_keep_their_registered_names():
    from celery import current_app

    registered = {name for name in current_app.tasks if name.startswith(f"{NAME}.")}
    assert registered == {f"{NAME}.{name}" for name in TASKS}


# --- the public surface ------------------------------------------------------------------


@cache
def public_surface() -> dict[str, set[str]]:
    """The table "What a host may import" of docs/architecture.md: module -> names."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## What a host may import", 1)[1].split("\n## ", 1)[0]
    surface = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith(f"`{NAME}"):
            surface[cells[0].strip("`")] = set(re.findall(r"`(\w+)`", cells[1]))
    return surface


def test_the_documented_surface_lists_the_hooks_a_host_writes():
    surface = public_surface()
    assert {"webhook_handler", "WebhookEvent", "HandlerResult"} <= surface[f"{NAME}.handlers"]
    assert {"enqueue_webhook", "destinations_for", "message_key"} <= surface[f"{NAME}.outbound"]
    assert "Scheme" in surface[f"{NAME}.schemes"]
    assert {"SenderEvent", "StateComparison"} <= surface[f"{NAME}.reconcile"]
    assert surface[f"{NAME}.signals"] == {"silence_alert_opened", "silence_alert_resolved"}


@pytest.mark.parametrize("module", sorted(public_surface()))
def test_each_public_name_imports(module):
    imported_module = importlib.import_module(module)
    missing = [name for name in public_surface()[module] if not hasattr(imported_module, name)]
    assert missing == []


def test_the_demo_host_imports_only_the_public_surface():
    surface = public_surface()
    used: list[tuple[str, str]] = []
    for path in (ROOT / "project").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(NAME):
                used += [(node.module, alias.name) for alias in node.names]
    outside = [
        (module, name)
        for module, name in used
        if name not in surface.get(module, set()) and f"{module}.{name}" not in surface
    ]
    assert used and outside == []
