"""kgpt's layers only look down, and no modules import each other in a circle.

Function-level imports count: an import inside a function still ties the
modules together, so neither can be read, tested or replaced without the
other. The package root `kgpt/__init__.py` is left out: it is the public
facade that imports everything, and Python runs it before any submodule.
"""

import ast
import pathlib

import kgpt

ROOT = pathlib.Path(kgpt.__file__).parent


def module_name(path):
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source, name, is_package, modules):
    """The `modules` that module `name` imports anywhere in its code (not in docstrings): a module, or its package."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1 packages
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m not in ("kgpt", name)}


def import_graph():
    paths = {module_name(p): p for p in ROOT.rglob("*.py")}
    return {
        name: imported_modules(path.read_text(), name, path.name == "__init__.py", paths)
        for name, path in paths.items()
        if name != "kgpt"
    }


def cycles(graph):
    """One cycle (a list of modules, first = last) per strongly connected group of modules that import each other."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(path_within(graph, group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def path_within(graph, group):
    """A cycle through the group's first module, found breadth-first inside the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle in {group}")


# Bottom to top; a module may import its own layer and the layers below. The modules at the package's
# root are the base (errors, logging, child processes) except `testing`, the plugin authors' helpers,
# which sits on top with the facade. The order and what each layer holds is CONTRIBUTING.md's layer map.
LAYERS = [
    "base",
    "io",
    "data",
    "tokenizers",
    "tasks",
    "parallel",
    "layers",
    "train",
    "models",
    "analysis",
    "jobs",
    "cli",
    "testing",
]


def layer(module):
    parts = module.split(".")
    if len(parts) == 2 and not (ROOT / parts[1]).is_dir():
        return "testing" if parts[1] == "testing" else "base"
    return parts[1]


def upward_imports(graph):
    """`a -> b` for each import of a module `b` in a layer above `a`'s."""
    return sorted(
        f"{a} ({layer(a)}) -> {b} ({layer(b)})"
        for a, imported in graph.items()
        for b in imported
        if LAYERS.index(layer(b)) > LAYERS.index(layer(a))
    )


def test_every_folder_of_kgpt_has_its_place_in_the_layers():
    folders = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert folders == set(LAYERS) - {"base", "testing"}, "add the new folder to LAYERS and to CONTRIBUTING.md's map"


def test_the_package_list_installs_every_folder_of_kgpt():
    import tomllib

    listed = set(tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {module_name(p.parent) for p in ROOT.rglob("__init__.py")}
    assert folders <= listed, f"add to pyproject.toml's packages: {sorted(folders - listed)}"


def test_no_module_imports_a_layer_above_its_own():
    found = upward_imports(import_graph())
    assert not found, "imports that look up the layers:\n" + "\n".join(found)


def test_the_layer_check_finds_an_upward_import():
    graph = {"kgpt.data.readers": {"kgpt.errors"}, "kgpt.io.storage": {"kgpt.jobs.rundir"}, "kgpt.jobs.rundir": set()}
    assert upward_imports(graph) == ["kgpt.io.storage (io) -> kgpt.jobs.rundir (jobs)"]


def code_lines(source):
    """The lines of `source` that hold code: not blank, not a comment, not a docstring."""
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, first.end_lineno + 1))
    return sum(
        1
        for number, line in enumerate(source.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#") and number not in docstrings
    )


def test_no_module_of_kgpt_holds_over_500_lines_of_code():
    # Docstrings and comments do not count, and a module holding one class may hold all of it: the limit
    # splits concerns, never a class.
    long = {}
    for path in ROOT.rglob("*.py"):
        source = path.read_text()
        classes = [node for node in ast.parse(source).body if isinstance(node, ast.ClassDef)]
        if (n := code_lines(source)) > 500 and len(classes) != 1:
            long[str(path.relative_to(ROOT.parent))] = n
    assert not long, f"split these by concern: {long}"


def test_code_lines_leave_out_docstrings_comments_and_blank_lines():
    source = 'def f():\n    """Doc\n    string."""\n\n    # why\n    return """not a docstring"""\n'
    assert code_lines(source) == 2


def test_the_checker_finds_a_cycle_hidden_in_a_function():
    graph = {"kgpt.a": {"kgpt.b"}, "kgpt.b": {"kgpt.c"}, "kgpt.c": {"kgpt.a"}, "kgpt.d": {"kgpt.a"}}
    assert cycles(graph) == [["kgpt.a", "kgpt.b", "kgpt.c", "kgpt.a"]]
    source = (
        '"""import kgpt.errors"""\n\ndef f():\n    from kgpt.tasks import task, nothing\n'
        "    from ..data import readers\n    import numpy\n"
    )
    modules = {"kgpt.tasks.task", "kgpt.tasks", "kgpt.data.readers", "kgpt.errors"}
    # As kgpt/analysis/m.py, `..` is kgpt; the docstring's import is no import, numpy is not kgpt.
    assert imported_modules(source, "kgpt.analysis.m", False, modules) == {
        "kgpt.tasks.task",
        "kgpt.tasks",
        "kgpt.data.readers",
    }


def test_no_import_cycles_among_kgpt_modules():
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_zero_shot_heuristics_do_not_depend_on_the_task_registry():
    graph, seen, todo = import_graph(), set(), ["kgpt.tasks.heuristics"]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph[module])
    assert not seen & {"kgpt.tasks.registry", "kgpt.tasks.hookspecs", "kgpt.analysis.zero_shot"}, sorted(seen)
