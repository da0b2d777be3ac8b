"""The one-way arrows of docs/development.md, as the imports have them: recorder → heartbeat → supervisor →
collector → bundle → analysis → renderers; the rank side imports nothing of the host side, the analysis never the
collector or the supervisor, nothing the CLI. Read from the source (ast), so a new import that breaks an arrow fails
here before it makes a cycle."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent.parent / "blackbox"

# part -> the parts of blackbox it may import (besides itself); a part is a subpackage or a top-level module
MAY_IMPORT: dict[str, set[str]] = {
    "_recorder": set(),
    "adapters": {"_recorder"},
    "frames": {"adapters"},
    "detections": set(),
    "errors": set(),
    "config": {"errors"},
    "safeopen": set(),
    "redact": {"_recorder"},
    "events": {"redact"},
    "heartbeat_reader": {"_recorder", "safeopen"},
    "bundle": {"__version__", "_recorder", "adapters", "detections", "errors"},
    "analyze": {"_recorder", "adapters", "bundle", "detections", "frames"},
    "render": {"analyze", "detections", "status"},
    "movers": {"_recorder", "adapters", "detections", "safeopen"},
    "status": {"_recorder", "adapters", "config", "detections", "errors", "events", "heartbeat_reader", "movers",
               "safeopen"},
    "incidents": {"_recorder", "analyze", "bundle", "errors", "events", "redact"},
    "intake": {"analyze", "bundle", "incidents"},
    "alerts": {"analyze", "redact"},
    "collect": {"_recorder", "adapters", "bundle", "detections", "errors", "events", "frames", "heartbeat_reader",
                "redact", "safeopen"},
    "coord": {"adapters", "errors"},
    "storage": {"analyze", "bundle", "errors", "incidents", "redact"},
    "supervisor": {"__version__", "_recorder", "adapters", "alerts", "analyze", "bundle", "collect", "config", "coord",
                   "detections", "errors", "events", "heartbeat_reader", "intake", "movers", "redact", "render",
                   "safeopen", "storage"},
    "doctor": {"_recorder", "adapters", "heartbeat_reader", "incidents", "supervisor"},
    "api": {"_recorder"},
}  # fmt: skip
UNCHECKED = {"cli", "__main__", "__init__"}  # the CLI may use everything; nothing may use it


def _imports() -> dict[str, set[str]]:
    """part -> the parts of blackbox its modules import."""
    out: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = list(rel.parts)
        package = module if path.name == "__init__.py" else module[:-1]
        part = module[1] if len(module) > 1 else module[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[list[str]] = []
            if isinstance(node, ast.ImportFrom):
                base = (package[: len(package) - node.level + 1] if node.level else []) + (
                    node.module.split(".") if node.module else [])  # fmt: skip
                targets = [[*base, a.name] for a in node.names] if not node.module else [base]
            elif isinstance(node, ast.Import):
                targets = [a.name.split(".") for a in node.names]
            for t in targets:
                if t[0] == "blackbox" and len(t) > 1 and t[1] != part:
                    out[part.removesuffix(".py")].add(t[1])
    return out


def test_every_part_imports_only_what_the_picture_allows() -> None:
    found = _imports()
    unknown = set(found) - set(MAY_IMPORT) - UNCHECKED
    assert not unknown, f"new parts {sorted(unknown)}: add them to MAY_IMPORT and docs/development.md"
    wrong = {part: sorted(found[part] - MAY_IMPORT[part]) for part in MAY_IMPORT if found[part] - MAY_IMPORT[part]}
    assert not wrong, f"imports against the arrows: {wrong}"


def test_nothing_imports_the_cli() -> None:
    found = _imports()
    assert not [part for part, targets in found.items() if "cli" in targets and part not in UNCHECKED]


# analyze/ flows one way: a module may import only the modules before it here (issue 34: no circle through verdict)
ANALYZE_ORDER = ["model", "sources", "nodes", "gpus", "motion", "evidence", "timeshare", "actions", "stackgroups",
                 "states", "blame", "verdict"]  # fmt: skip


def test_analysis_flows_one_way_from_states_to_the_verdict() -> None:
    folder = PACKAGE / "analyze"
    assert {p.stem for p in folder.glob("*.py")} - {"__init__"} == set(ANALYZE_ORDER), "add it to ANALYZE_ORDER"
    wrong = []
    for stem in ANALYZE_ORDER:
        below = set(ANALYZE_ORDER[: ANALYZE_ORDER.index(stem)])
        for node in ast.walk(ast.parse((folder / f"{stem}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names = [node.module] if node.module else [a.name for a in node.names]
                wrong += [f"{stem} -> {n.split('.')[0]}" for n in names if n.split(".")[0] not in below]
    assert not wrong, f"imports against analyze/'s one way: {wrong}"


def _module_imports() -> dict[str, set[str]]:
    """module (dotted) -> the modules of blackbox it imports, at the top or inside a function alike."""
    modules = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for p in PACKAGE.rglob("*.py")}  # fmt: skip
    out: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = (package[: len(package) - node.level + 1] if node.level else []) + (
                    node.module.split(".") if node.module else [])  # fmt: skip
                names = [".".join(base)] + [".".join([*base, a.name]) for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            out[module] |= {n for n in names if n in modules and n != module}
    return out


def test_no_module_imports_itself_back_through_others() -> None:
    graph = _module_imports()
    circles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if nxt.startswith(node + "."):
                continue  # a package importing its own modules is how a package speaks, not a circle
            if state.get(nxt) == 1 and not node.startswith(nxt + "."):
                circles.append([*path[path.index(nxt) :], node, nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                walk(nxt, [*path, node])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module, [])
    assert not circles, f"modules that import themselves back: {circles}"


def test_every_file_fits_a_room_and_every_command_only_parses() -> None:
    long_files = [f"{p.relative_to(PACKAGE.parent)}: {n}" for p in PACKAGE.rglob("*.py")
                  if (n := len(p.read_text().splitlines())) > 700]  # fmt: skip
    assert not long_files, f"files over 700 lines: {long_files}"
    long_commands = []
    for path in (PACKAGE / "cli").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.end_lineno is None:
                continue
            if (n := node.end_lineno - node.lineno + 1) > 40:
                long_commands.append(f"{path.name}:{node.name}: {n}")
    assert not long_commands, f"CLI functions over 40 lines (move the work into the core): {long_commands}"
