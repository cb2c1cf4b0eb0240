"""The imports that are never allowed (ARCHITECTURE.md), checked with `ast` over the installed
package's files: every `import` / `from ... import` anywhere in a module counts, lazy ones inside
functions included.

* rewards -> anything of ours but `verl_search.protocol` (pure functions, cheap to import);
* `verl_search.protocol` -> anything of ours outside it, anything outside the standard library (the leaf);
* runtime -> anything of ours outside it, verl (flags, `VERL_SEARCH_*`, extras, exit codes: every room
  imports it, the retrieval service included);
* retrieval -> server, tools, agent_loop, eval, web, generation, training, quickstart, verl_config, verl,
  and the HTTP libraries (retrievers know no HTTP and no verl);
* server, web -> tools, agent_loop, eval, generation, training, quickstart, verl_config, verl (the retrieval
  service runs in an install without verl; web is the same service over web APIs);
* tools, agent_loop -> retrieval (they talk to the service over HTTP only);
* generation -> retrieval, server, tools, agent_loop, eval, training, quickstart, web (an engine knows
  tokens, not who asks for them);
* verl_config -> retrieval, server, web, eval, quickstart, generation (composing and checking verl's
  config needs none of them; they import it);
* data -> server, web, tools, agent_loop, eval, generation, training, quickstart (preprocessing and
  downloads know nothing of what runs on their output).

Beyond the direct imports, the retrieval service's whole import graph (server, web, retrieval and
everything of ours they reach, lazily or not) never reaches verl.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import verl_search

PACKAGE = Path(verl_search.__file__).parent

#: (package area, forbidden import prefixes); an area is a sub-package or a module of verl_search
#: the HTTP libraries (a retriever knows none of them)
HTTP = ("fastapi", "starlette", "uvicorn", "aiohttp", "httpx", "requests")
#: the rooms of the verl side (the retrieval service never imports them)
VERL_SIDE = ("verl_search.tools", "verl_search.agent_loop", "verl_search.eval", "verl_search.generation",
             "verl_search.training", "verl_search.quickstart", "verl_search.verl_config", "verl")
FORBIDDEN = {
    "rewards": ("verl_search.",),
    "protocol": ("verl_search.",),
    "runtime": ("verl_search.", "verl"),
    "retrieval": ("verl_search.server", "verl_search.web", *VERL_SIDE, *HTTP),
    "server": VERL_SIDE,
    "web": VERL_SIDE,
    "tools": ("verl_search.retrieval",),
    "agent_loop": ("verl_search.retrieval",),
    "generation": ("verl_search.retrieval", "verl_search.server", "verl_search.tools", "verl_search.agent_loop",
                   "verl_search.eval", "verl_search.training", "verl_search.quickstart", "verl_search.web"),
    "verl_config": ("verl_search.retrieval", "verl_search.server", "verl_search.web", "verl_search.eval",
                    "verl_search.quickstart", "verl_search.generation"),
    "data": ("verl_search.server", "verl_search.web", "verl_search.tools", "verl_search.agent_loop",
             "verl_search.eval", "verl_search.generation", "verl_search.training", "verl_search.quickstart"),
}
#: what an area may import even though a prefix above forbids it
ALLOWED = {
    "rewards": ("verl_search.protocol", "verl_search.rewards"),
    "protocol": ("verl_search.protocol",),
    "runtime": ("verl_search.runtime",),
}


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


def violations(area: str) -> list[str]:
    """`file:line imports name` for each forbidden import of `area`."""
    root = PACKAGE / area
    files = sorted(root.rglob("*.py")) if root.is_dir() else [PACKAGE / f"{area}.py"]
    allowed = ALLOWED.get(area, ())
    found = []
    for path in files:
        for line, name in imports_of(path):
            if name == "verl_search" or any(_matches(name, a) for a in allowed):
                continue
            for prefix in FORBIDDEN[area]:
                if (prefix == "verl_search." and name.startswith(prefix)) or (prefix != "verl_search." and _matches(name, prefix)):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
    return found


def test_the_package_has_every_area():
    for area in FORBIDDEN:
        assert (PACKAGE / area).is_dir() or (PACKAGE / f"{area}.py").is_file(), f"verl_search.{area} is missing"


@pytest.mark.parametrize("area", sorted(FORBIDDEN))
def test_no_forbidden_import(area):
    found = violations(area)
    assert not found, f"forbidden imports of verl_search.{area} (see ARCHITECTURE.md):\n" + "\n".join(found)


def test_the_walk_sees_lazy_imports():
    # a checker that misses imports inside functions would pass vacuously
    sample = PACKAGE / "cli.py"
    names = {name for _, name in imports_of(sample)}
    assert "verl_search.server.command" in names  # imported inside a function
    assert "verl_search.eval.harness" in names


def test_protocol_is_standard_library_only():
    import sys

    stdlib = set(sys.stdlib_module_names) | {"__future__", "verl_search"}  # ours: checked above
    files = sorted((PACKAGE / "protocol").glob("*.py"))
    assert {path.name for path in files} >= {"__init__.py", "vocabulary.py", "tokens.py"}
    for path in files:
        names = {name.split(".")[0] for _, name in imports_of(path)}
        assert names <= stdlib, f"verl_search.protocol.{path.stem} imports {sorted(names - stdlib)}"


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
    service = [m for m in graph if m.split(".")[1:2] in (["server"], ["web"], ["retrieval"])]
    assert "verl_search.server.app" in service and "verl_search.retrieval.bm25" in service
    reached = _reached(service, graph)
    verl_side = sorted(m for m in reached if any(_matches(m, prefix) for prefix in VERL_SIDE))
    assert not verl_side, f"the retrieval service reaches the verl side: {verl_side}"
    importers = sorted(f"{_module_name(path)}:{line} imports {name}"
                       for path in PACKAGE.rglob("*.py") if _module_name(path) in reached
                       for line, name in imports_of(path) if _matches(name, "verl"))
    assert not importers, "the retrieval service imports verl:\n" + "\n".join(importers)
