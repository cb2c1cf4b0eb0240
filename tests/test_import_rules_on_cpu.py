"""Who may import whom (ARCHITECTURE.md, "Who may import whom"), checked with `ast` over the installed
package's files: every `import` / `from ... import` anywhere in a module counts, lazy ones inside
functions included.

* `MAY_IMPORT`: for each folder of `verl_search`, the folders of ours it may import. The table is
  ARCHITECTURE.md's (a test compares them), it has no circle (so no two folders import each other),
  and every import of ours keeps to it.
* Outside ours: `agent_protocol/` imports the standard library only; `runtime/`, `retrieval/` and `server/`
  never import verl, and `retrieval/` no HTTP library (retrievers know no HTTP and no verl).

Beyond the direct imports, the retrieval service's whole import graph (server, retrieval and
everything of ours they reach, lazily or not) never reaches verl.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

import verl_search

PACKAGE = Path(verl_search.__file__).parent
ARCHITECTURE = Path(__file__).resolve().parents[1] / "ARCHITECTURE.md"

#: folder -> the folders of ours it may import (lower floors first; `cli.py` may import any)
MAY_IMPORT = {
    "agent_protocol": (),
    "runtime": (),
    "rewards": ("agent_protocol",),
    "datasets": ("agent_protocol", "rewards"),
    "retrieval": ("datasets", "runtime"),
    "server": ("agent_protocol", "retrieval", "runtime"),
    "llm": ("agent_protocol", "runtime"),
    "verl_config": ("agent_protocol", "runtime"),
    "tools": ("agent_protocol", "runtime", "server", "verl_config"),
    "cpu": ("llm", "runtime", "verl_config"),
    "agent_loop": ("agent_protocol", "llm", "tools", "verl_config"),
    "training": ("agent_protocol", "cpu", "datasets", "llm", "retrieval", "rewards", "runtime", "tools",
                 "verl_config"),
    "report": ("llm", "retrieval", "rewards", "training"),
    "eval": ("agent_protocol", "cpu", "datasets", "llm", "report", "retrieval", "rewards", "server", "verl_config"),
    "quickstart": ("agent_protocol", "cpu", "datasets", "eval", "llm", "report", "retrieval", "runtime", "server",
                   "training", "verl_config"),
    "configs": (),
}
#: the HTTP libraries (a retriever knows none of them)
HTTP = ("fastapi", "starlette", "uvicorn", "aiohttp", "httpx", "requests")
#: folder -> modules outside ours it never imports
NEVER_OUTSIDE = {"runtime": ("verl",), "retrieval": ("verl", *HTTP), "server": ("verl",)}
#: the folders of the verl side (the retrieval service never reaches them)
VERL_SIDE = tuple(f"verl_search.{folder}" for folder in
                  ("tools", "agent_loop", "eval", "llm", "training", "quickstart", "verl_config", "cpu"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """`(line, absolute module name)` of every import in a file (relative imports resolved)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names if base == "verl_search"]
    return found


def _matches(name: str, prefix: str) -> bool:
    prefix = prefix.rstrip(".")
    return name == prefix or name.startswith(prefix + ".")


def _folder(name: str) -> str | None:
    """The folder of ours a module name is in (`verl_search.cpu.plugin` -> `cpu`); None outside ours or for
    a top-level module (`verl_search.cli`)."""
    parts = name.split(".")
    return parts[1] if parts[0] == "verl_search" and len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else None


def violations(folder: str) -> list[str]:
    """`file:line imports name` for each import of `folder` that `MAY_IMPORT` / `NEVER_OUTSIDE` refuse."""
    allowed = {folder, *MAY_IMPORT[folder]}
    found = []
    for path in sorted((PACKAGE / folder).rglob("*.py")):
        for line, name in imports_of(path):
            target = _folder(name)
            ours_refused = target is not None and target not in allowed
            outside_refused = any(_matches(name, prefix) for prefix in NEVER_OUTSIDE.get(folder, ()))
            if ours_refused or outside_refused:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
    return found


def test_every_folder_has_a_row():
    folders = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file()}
    assert folders == set(MAY_IMPORT), f"folders without a row: {folders - set(MAY_IMPORT)}; rows without a " \
                                       f"folder: {set(MAY_IMPORT) - folders}"


@pytest.mark.parametrize("folder", sorted(MAY_IMPORT))
def test_no_forbidden_import(folder):
    found = violations(folder)
    assert not found, f"imports verl_search.{folder} may not make (ARCHITECTURE.md):\n" + "\n".join(found)


def test_every_allowance_is_used():
    # a row that allows more than the folder imports would let a new import in unnoticed
    for folder, deps in MAY_IMPORT.items():
        used = {_folder(name) for path in (PACKAGE / folder).rglob("*.py") for _, name in imports_of(path)}
        assert set(deps) <= used, f"verl_search.{folder} no longer imports {sorted(set(deps) - used)}: drop them"


def test_the_table_has_no_circle():
    # a folder on a circle could not be read or moved without the others; no two folders import each other
    order: list[str] = []
    todo = dict(MAY_IMPORT)
    while todo:
        ready = sorted(folder for folder, deps in todo.items() if set(deps) <= set(order))
        assert ready, f"MAY_IMPORT has a circle among {sorted(todo)}"
        order += ready
        for folder in ready:
            del todo[folder]


def test_architecture_md_shows_the_same_table():
    section = ARCHITECTURE.read_text(encoding="utf-8").split("## Who may import whom", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for match in re.finditer(r"^\| `(\w+)/` \| ([^|]*) \|", section, re.M):
        ours = re.sub(r"\(.*?\)", "", match.group(2))  # "(never `verl`)": outside ours, checked by NEVER_OUTSIDE
        rows[match.group(1)] = tuple(sorted(re.findall(r"`(\w+)`", ours)))
    assert rows == {folder: tuple(sorted(deps)) for folder, deps in MAY_IMPORT.items()}


def test_a_forbidden_import_is_found(tmp_path, monkeypatch):
    # the check must be able to fail: lazy imports of the verl side and of HTTP inside retrieval/, in a copy
    package = tmp_path / "verl_search"
    for folder in ("retrieval", "eval"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("", encoding="utf-8")
    (package / "retrieval" / "probe.py").write_text(
        "from verl_search.runtime import env\n\ndef f():\n    from verl_search.eval import harness\n    import httpx\n",
        encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    assert violations("retrieval") == ["verl_search/retrieval/probe.py:4 imports verl_search.eval",
                                       "verl_search/retrieval/probe.py:5 imports httpx"]


def test_the_walk_sees_lazy_imports():
    # a checker that misses imports inside functions would pass vacuously
    sample = PACKAGE / "cli.py"
    names = {name for _, name in imports_of(sample)}
    assert "verl_search.server.command" in names  # imported inside a function
    assert "verl_search.eval.harness" in names


def test_protocol_is_standard_library_only():
    import sys

    stdlib = set(sys.stdlib_module_names) | {"__future__", "verl_search"}  # ours: checked above
    files = sorted((PACKAGE / "agent_protocol").glob("*.py"))
    assert {path.name for path in files} >= {"__init__.py", "vocabulary.py", "tokens.py"}
    for path in files:
        names = {name.split(".")[0] for _, name in imports_of(path)}
        assert names <= stdlib, f"verl_search.agent_protocol.{path.stem} imports {sorted(names - stdlib)}"


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (lazy imports included; a name is cut back to the
    module that holds it). A package's `__init__` importing its own sub-modules is left out."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else None
        deps = set()
        for _, name in imports_of(path):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name not in (module, "verl_search") and not (package and name.startswith(package + ".")):
                deps.add(name)
        graph[module] = deps
    return graph


def test_no_import_circle():
    # a circle (a imports b, b imports a, lazily or not) means neither module can be read or moved alone
    graph = _import_graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                circles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, path + [dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles:\n" + "\n".join(circles)


def _reached(start: list[str], graph: dict[str, set[str]]) -> set[str]:
    """`start` and every module of ours it reaches through `graph`."""
    seen, todo = set(), list(start)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph[module])
    return seen


def test_the_retrieval_service_never_reaches_verl():
    # direct rules miss a chain (server -> runtime -> something importing verl); walk the whole graph
    graph = _import_graph()
    service = [m for m in graph if m.split(".")[1:2] in (["server"], ["retrieval"])]
    assert "verl_search.server.app" in service and "verl_search.retrieval.bm25" in service
    reached = _reached(service, graph)
    verl_side = sorted(m for m in reached if any(_matches(m, prefix) for prefix in VERL_SIDE))
    assert not verl_side, f"the retrieval service reaches the verl side: {verl_side}"
    importers = sorted(f"{_module_name(path)}:{line} imports {name}"
                       for path in PACKAGE.rglob("*.py") if _module_name(path) in reached
                       for line, name in imports_of(path) if _matches(name, "verl"))
    assert not importers, "the retrieval service imports verl:\n" + "\n".join(importers)
