"""The package's layering, read from the source's import statements (nothing is imported):

    runtime   draftcore/ but draftcore/tools: numpy and numba only; no tooling, no adapter; no cycles
    adapters  adapters/<backend> (draftcore.adapters.<backend>): the runtime and their own framework;
              no tooling, no other adapter
    tooling   draftcore/tools, benchmarks/, examples/: anything but the tests
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "adapters":
        parts = ["draftcore"] + parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every module name an import statement in `path` names (relative imports resolved), including
    `from package import name` as package.name, and imports inside functions."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def python_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


RUNTIME = [p for p in python_files("draftcore") if "tools" not in p.relative_to(ROOT / "draftcore").parts]
ADAPTERS = python_files("adapters")


def within(names: set[str], prefix: str) -> set[str]:
    return {n for n in names if n == prefix or n.startswith(prefix + ".")}


def test_the_runtime_imports_no_tooling_and_no_adapter():
    for path in RUNTIME:
        wrong = within(imports_of(path), "draftcore.tools") | within(imports_of(path), "draftcore.adapters")
        assert not wrong, (str(path.relative_to(ROOT)), sorted(wrong))


def test_the_runtime_has_no_import_cycles():
    modules = {module_name(p): p for p in RUNTIME}
    graph = {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}
    # a cycle exists iff some module reaches itself
    for start in graph:
        seen, frontier = set(), list(graph[start])
        while frontier:
            node = frontier.pop()
            assert node != start, f"{start} imports itself through {sorted(seen)}"
            if node not in seen:
                seen.add(node)
                frontier.extend(graph[node])


def test_adapters_import_no_tooling_and_no_other_adapter():
    for path in ADAPTERS:
        own = "draftcore.adapters." + path.relative_to(ROOT / "adapters").parts[0]
        names = imports_of(path)
        others = {n for n in within(names, "draftcore.adapters") if not (n == own or n.startswith(own + "."))
                  and n != "draftcore.adapters"}
        assert not within(names, "draftcore.tools") and not others, (str(path.relative_to(ROOT)),
                                                                    sorted(within(names, "draftcore.tools") | others))


def test_nothing_shipped_imports_the_tests():
    for path in python_files("draftcore", "adapters", "examples"):
        text = path.read_text()
        assert "tests" not in {n.split(".")[0] for n in imports_of(path)}, str(path.relative_to(ROOT))
        assert '"tests"' not in text and "'tests'" not in text, f"{path.relative_to(ROOT)} names the tests folder"


def test_benchmarks_reach_into_the_tests_only_for_their_fixtures():
    """tests/fixtures (the toy model, the tiny Llama, the GGUF writer, the naive trie) is the one part of
    tests/ that benchmarks share: it stays out of the wheel. Any other test module stays the tests' own."""
    tests = ROOT / "tests"
    test_modules = {p.stem for p in tests.glob("*.py")} | {p.name for p in tests.iterdir() if p.is_dir()}
    for path in python_files("benchmarks"):
        reached = {n.split(".")[0] for n in imports_of(path)} & (test_modules - {"fixtures"})
        assert not reached, f"{path.relative_to(ROOT)} imports test modules {sorted(reached)}"