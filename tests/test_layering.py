"""The package's layers, read from its import statements (ast; nothing is imported).

DESIGN.md's rules as a test, and the folders are the layers: the engine at the top level
(Tensor and its method families, autograd, creation, amp, functional, testing, cuda) with
ops/ beneath it and backend/ and system/ below; nn/ and optim/ on the engine; data/,
checkpoint/, pretrained/ and distributed/ on those; the applications train/, profiler/,
bench/ and evaluation/ on top; cli/ above all. Each module belongs to one layer and imports
only from its own layer or the layers below; within a layer a folder imports another only
where SIDEWAYS says so; the backend imports nothing outside itself; nothing below the CLI
imports the CLI.
The one import circle allowed is the tensor <-> ops join: Tensor's operators and
`backward()` call the ops and autograd's engine, which build their results as Tensors.
Imports inside functions count: a lazy import is still a dependency.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "minitorch_gpu"

# Bottom up, one entry per folder (or top-level module). A module's layer is that of its
# top-level name; a module in none of them fails the test, so a new file is placed on purpose.
ENGINE = ("from_python", "tensor", "tensor_math", "tensor_shape", "tensor_inplace", "autograd",
          "ops", "amp", "creation", "functional", "testing", "cuda", "capturing")
LAYERS: List[Tuple[str, Tuple[str, ...]]] = [
    ("foundation", ("backend", "system")),
    ("engine", ENGINE),
    ("model", ("nn", "optim")),
    ("inputs and outputs", ("data", "checkpoint", "pretrained", "distributed")),
    ("application", ("train", "profiler", "bench", "evaluation")),
    ("command line", ("cli", "__main__")),
]

# Within a layer, the folders that may import another of the same layer (the engine's
# modules are one unit and import each other freely). Every pair not listed is refused:
# optim never imports nn, the profiler and the bench never the trainer, and so on.
SIDEWAYS = {
    ("system", "backend"): "the machine's ceilings are measured on a backend's device",
    ("nn", "optim"): "CausalLM.configure_optimizers builds the model's AdamW (lazily)",
    ("pretrained", "data"): "a pretrained model comes with its tokenizer",
    ("pretrained", "checkpoint"): "from_pretrained reads this project's checkpoints too",
    ("train", "evaluation"): "the trainer scores HellaSwag every eval.hellaswag_interval "
                             "iterations",
    ("__main__", "cli"): "python -m minitorch_gpu runs the CLI",
}

# The tensor <-> ops join: the only imports that reach up, and the only circle.
JOIN = ("tensor", "tensor_math", "tensor_shape", "tensor_inplace", "autograd", "ops")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> Dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, modules: Set[str]) -> Set[str]:
    """The package's modules that `name` imports (relative names, '' for the root)."""
    is_package = path.name == "__init__.py"
    found: Set[str] = set()

    def resolve(dotted: str) -> str:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "minitorch_gpu" or alias.name.startswith("minitorch_gpu."):
                    found.add(resolve(alias.name[len("minitorch_gpu."):]))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if name else []
                if not is_package:
                    base = base[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and (node.module == "minitorch_gpu"
                                  or node.module.startswith("minitorch_gpu.")):
                target = node.module[len("minitorch_gpu."):]
            else:
                continue
            for alias in node.names:  # `from . import ops` imports the module ops
                submodule = f"{target}.{alias.name}" if target else alias.name
                found.add(submodule if submodule in modules else resolve(target))
    found.discard(name)
    return found


def _graph() -> Dict[str, Set[str]]:
    modules = _modules()
    names = set(modules)
    return {name: _imports(name, path, names) for name, path in modules.items()}


def _top(name: str) -> str:
    return name.split(".")[0]


def _in(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _layer(name: str) -> int:
    if not name:  # the package root: the public face (the engine, nn, optim and, imported
        # when called, from_pretrained), which only the applications and the CLI import
        return [layer for layer, _ in LAYERS].index("application")
    for rank, (_, prefixes) in enumerate(LAYERS):
        if _in(name, prefixes):
            return rank
    raise KeyError(name)


def _cycles(graph: Dict[str, Set[str]]) -> List[Set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[Set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return components


GRAPH = _graph()


def test_every_module_has_a_layer():
    unplaced = [name for name in GRAPH if name and _top(name) not in
                {p for _, prefixes in LAYERS for p in prefixes}]
    assert not unplaced, (f"modules in no layer: {unplaced}; add each to LAYERS here and "
                          "to docs/DESIGN.md's layer list")


@pytest.mark.parametrize("name", sorted(n for n in GRAPH if n))
def test_imports_look_down(name):
    rank = _layer(name)
    upward = []
    for target in sorted(GRAPH[name]):
        if _layer(target) <= rank:
            continue
        if _in(name, JOIN) and _in(target, JOIN):
            continue
        upward.append(f"{target or 'minitorch_gpu'} ({LAYERS[_layer(target)][0]})")
    assert not upward, (f"{name} ({LAYERS[rank][0]} layer) imports from above its layer: "
                        f"{', '.join(upward)}")


def _sideways() -> List[str]:
    found = []
    for name, targets in GRAPH.items():
        if not name or _top(name) in ENGINE:
            continue
        for target in targets:
            if (target and _top(target) != _top(name) and _layer(target) == _layer(name)
                    and (_top(name), _top(target)) not in SIDEWAYS):
                found.append(f"{name} imports {target}")
    return sorted(found)


def test_folders_in_a_layer_import_each_other_only_as_listed():
    offenders = _sideways()
    assert not offenders, (f"imports between folders of one layer that SIDEWAYS does not "
                           f"allow: {'; '.join(offenders)}")


def test_the_sideways_check_sees_a_sideways_import(monkeypatch):
    # the check is real: a profiler module importing the trainer would be refused
    monkeypatch.setitem(GRAPH, "profiler.costs", GRAPH["profiler.costs"] | {"train.trainer"})
    assert _sideways() == ["profiler.costs imports train.trainer"]


def test_only_the_cli_imports_the_cli():
    offenders = [f"{name} imports {target}" for name, targets in GRAPH.items()
                 if name and not _in(name, ("cli", "__main__")) for target in targets
                 if _in(target, ("cli",))]
    assert not offenders, offenders


def test_top_level_holds_the_engine_alone():
    """The top level is the engine (and the package's face, __init__ and __main__); every
    other layer is a folder, whose name says what it holds."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert set(top) <= set(ENGINE), f"top-level modules outside the engine: {set(top) - set(ENGINE)}"
    assert len(top) <= 12, top


def test_every_folder_says_what_it_holds_and_may_import():
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "layer" in doc and "import" in doc, (
            f"{init.relative_to(PACKAGE)}: its docstring should say what it holds and what "
            f"it may import")


def test_backend_imports_nothing_above_it():
    offenders = [f"{name} imports {target}" for name, targets in GRAPH.items()
                 if _in(name, ("backend",)) for target in targets
                 if not _in(target, ("backend",))]
    assert not offenders, f"the backend knows nothing of tensors or autograd: {offenders}"


def test_ops_never_import_nn():
    offenders = [f"{name} imports {target}" for name, targets in GRAPH.items()
                 if _in(name, ("ops",)) for target in targets if _in(target, ("nn",))]
    assert not offenders, offenders


def test_only_the_tensor_ops_join_is_a_circle():
    circles = []
    for component in _cycles(GRAPH):
        if all(_in(name, JOIN) for name in component):
            continue
        circles.append(sorted(component))
    assert not circles, f"import circles outside the tensor <-> ops join: {circles}"


def test_the_join_is_still_what_design_says():
    # The test above would pass vacuously if the join vanished; it is real, and small.
    joined = [c for c in _cycles(GRAPH) if "tensor" in c]
    assert joined and all(_in(name, JOIN) for name in joined[0])


def test_no_module_is_over_500_lines():
    """DESIGN.md's rule: a file that grows past 500 lines holds two ideas; split it."""
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500}
    assert not long, f"modules over 500 lines (split each by idea): {long}"
