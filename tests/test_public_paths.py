"""One public path and one name per thing.

The facade `kgpt` holds classes, functions and constants, each taken from the
module that defines it; a module is used by its own path (`from kgpt.tasks
import transforms`), never through the facade or another module. No module
passes on a name it imports without using it (a re-export is a second path),
and no two public classes below the jobs layer share a name (a head and an
input transformation were both `Classification`).
"""

import ast
import collections
import pathlib
import types

import kgpt

ROOT = pathlib.Path(kgpt.__file__).parent


def module_path(name):
    path = ROOT.parent.joinpath(*name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def top_level_definitions(path):
    """Names a module binds itself at its top level: defs, classes and assignments (not imports)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def test_the_facade_takes_each_name_from_the_module_that_defines_it():
    wrong = {
        name: module for name, module in kgpt._NAMES.items() if name not in top_level_definitions(module_path(module))
    }
    assert not wrong, f"names the facade takes from a module that only imports them: {wrong}"
    modules = [name for name in kgpt.__all__ if name != "log" and isinstance(getattr(kgpt, name), types.ModuleType)]
    assert not modules, f"modules offered by the facade (use them by their own path): {modules}"


# Every module of kgpt but the facade, whose imports are its public names.
LOWER = (
    "errors.py",
    "checks.py",
    "log.py",
    "_quiet.py",
    "_children.py",
    "testing.py",
    "io",
    "data",
    "tokenizers",
    "tasks",
    "parallel",
    "layers",
    "models",
    "train",
    "analysis",
    "jobs",
    "cli",
)


def lower_modules():
    for part in LOWER:
        path = ROOT / part
        yield from [path] if path.is_file() else sorted(path.rglob("*.py"))


def unused_imports(path):
    """Names imported from kgpt in `path` that its code never reads: re-exports."""
    tree = ast.parse(path.read_text())
    imported = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "kgpt"):
            for alias in node.names:
                imported[alias.asname or alias.name] = node.lineno
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return {name: line for name, line in imported.items() if name not in read}


def test_no_module_passes_on_a_name_it_imports():
    found = {
        f"{path.relative_to(ROOT.parent)}:{line}": name
        for path in lower_modules()
        for name, line in unused_imports(path).items()
    }
    assert not found, f"kgpt names imported and never used (a second path to them): {found}"


def test_no_two_public_classes_share_a_name():
    where = collections.defaultdict(list)
    for path in lower_modules():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where[node.name].append(str(path.relative_to(ROOT.parent)))
    assert not {name: paths for name, paths in where.items() if len(paths) > 1}
