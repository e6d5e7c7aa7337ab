"""The import graph: no module imports itself round a cycle, every module imports on its
own in a fresh interpreter, and the packages depend on each other in one order:

    core (codec, errors, ids, plan, messages, wire, ...)  <-  operators.base (the interface)
    <-  checkpoint, runtime  <-  executors, monitor  <-  api, compiler, testing, cli

with the operator library (``operators``) beside the runtime: it uses the core and the
interface, and the engine meets it only there (the runtime does not import the library,
the executors neither the library nor the user API). Imports under TYPE_CHECKING are
annotations, not dependencies, and are left out."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("abs_engine", "operators")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _imported(module: str, path: Path, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        parts = module.split(".")
        keep = len(parts) - node.level + (1 if path.name == "__init__.py" else 0)
        base = ".".join(parts[:keep] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
    return subs + ([base] if len(subs) < len(node.names) else [])


def import_graph() -> nx.DiGraph:
    known = modules()
    g = nx.DiGraph()
    for name, path in known.items():
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for top in ast.walk(tree)
                       if isinstance(top, ast.If) and "TYPE_CHECKING" in ast.dump(top.test) for n in ast.walk(top)}
        g.add_node(name)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in typing_only:
                for target in _imported(name, path, node, known):
                    while target and target not in known:
                        target = target.rpartition(".")[0]
                    if target and target != name:
                        g.add_edge(name, target)
    return g


def layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "operators":
        return "interface" if module in ("operators.base", "operators.record_errors", "operators.state_layout",
                                         "operators.progress") else "library"
    if len(parts) > 1 and parts[1] in ("checkpoint", "runtime", "executors", "monitor", "simulation"):
        return parts[1]
    if module in ("abs_engine", "abs_engine.api", "abs_engine.streams", "abs_engine.keyed", "abs_engine.windowed",
                  "abs_engine.compiler", "abs_engine.testing", "abs_engine.cli"):
        return "api"
    return "core"


#: What each layer may import (besides itself).
ALLOWED = {
    "core": {"core"},
    "interface": {"core"},
    "checkpoint": {"core"},
    "runtime": {"core", "interface", "checkpoint"},
    "library": {"core", "interface"},
    "monitor": {"core", "checkpoint"},
    "executors": {"core", "checkpoint", "runtime", "monitor"},
    "api": {"core", "interface", "library", "checkpoint", "runtime", "monitor", "executors", "api"},
    "simulation": {"core", "interface", "checkpoint", "runtime"},
}


def test_no_module_imports_itself_round_a_cycle() -> None:
    cycles = [sorted(c) for c in nx.strongly_connected_components(import_graph()) if len(c) > 1]
    assert not cycles, cycles


def test_the_packages_depend_on_each_other_in_one_order() -> None:
    wrong = sorted(f"{a} ({layer(a)}) imports {b} ({layer(b)})" for a, b in import_graph().edges()
                   if layer(b) != layer(a) and layer(b) not in ALLOWED[layer(a)])
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_a_cycle_and_a_wrong_dependency() -> None:
    g = import_graph()
    g.add_edge("abs_engine.codec", "abs_engine.runtime.task")  # as if the core imported the runtime
    assert any(len(c) > 1 for c in nx.strongly_connected_components(g))
    assert layer("abs_engine.codec") == "core" and "runtime" not in ALLOWED["core"]


def test_every_module_imports_on_its_own() -> None:
    """Interpreters that forget the engine's modules before each import: an import that
    works only after another module was imported first fails here. (``__main__`` modules
    run a program when imported: left out.) Two interpreters, each half the modules, side
    by side."""
    names = sorted(m for m in modules() if not m.endswith("__main__"))
    procs = [subprocess.Popen([sys.executable, "-c", _importer(names[i::2])], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        assert out.strip() == "imported every module", out  # (a module that exits stops short)


def _importer(names: list[str]) -> str:
    return (
        "import importlib, sys\n"
        f"names = {names!r}\n"
        "failed = []\n"
        "for name in names:\n"
        "    for m in [m for m in sys.modules if m.split('.')[0] in ('abs_engine', 'operators', 'examples')]:\n"
        "        del sys.modules[m]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as e:\n"
        "        failed.append(f'{name}: {type(e).__name__}: {e}')\n"
        "print('\\n'.join(failed + ['imported every module']))\n"
    )
