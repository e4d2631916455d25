"""Task discovery: a pluggy plugin manager fed from the `kgpt` entry points.

Entry points are loaded one by one here rather than with pluggy's
`load_setuptools_entrypoints`, which stops at the first plugin that fails to
import. A broken plugin is recorded with its name, entry point and error, and
every other task keeps working; asking for a task of that plugin re-raises
its error with that context.

```python
registry = kgpt.TaskRegistry()        # built-in + installed plugins
registry.names()                      # ['boolq', 'scitail', ...]
task = registry.get("scitail")
```
Tests pass plugin objects directly: `TaskRegistry(plugins=[obj], entry_points=[])`.
"""

import dataclasses
import difflib
import importlib.metadata
import traceback

import pluggy

from kgpt import hookspecs
from kgpt.task import Task


class RegistryError(LookupError):
    """An unknown, conflicting or broken task."""


@dataclasses.dataclass(frozen=True)
class TaskEntry:
    """A registered task and the plugin that registered it."""

    task: Task
    plugin: str  # plugin (entry point) name
    origin: str  # e.g. "entry point scitail = kgpt_tasks.scitail (kgpt 0.1.0)"


@dataclasses.dataclass(frozen=True)
class BrokenPlugin:
    """A plugin that failed to import or to register its tasks."""

    plugin: str
    origin: str
    stage: str  # "import" or "register_tasks"
    error: BaseException

    def describe(self):
        return f"plugin {self.plugin!r} ({self.origin}) failed in {self.stage}: {type(self.error).__name__}: {self.error}"


def _origin(entry_point):
    dist = getattr(entry_point, "dist", None)
    where = f" ({dist.name} {dist.version})" if dist is not None else ""
    return f"entry point {entry_point.name} = {entry_point.value}{where}"


class TaskRegistry:
    """All tasks from plugins: entry points of group `kgpt`, plus `plugins` given directly.

    Args:
        plugins: extra plugin objects (modules or instances with
            `@kgpt.hookimpl` functions), registered under their `__name__`
            or class name.
        entry_points: `None` to discover installed entry points; an iterable
            of `importlib.metadata.EntryPoint` to use those instead (`[]`
            for none).
    """

    def __init__(self, plugins=(), entry_points=None):
        self.manager = pluggy.PluginManager(hookspecs.PROJECT)
        self.manager.add_hookspecs(hookspecs)
        self.broken = []
        self.conflicts = {}  # task name -> [TaskEntry, ...] (two or more claims)
        self._origins = {}
        if entry_points is None:
            entry_points = importlib.metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP)
        for entry_point in sorted(entry_points, key=lambda ep: (ep.name, ep.value)):
            self._load(entry_point)
        for plugin in plugins:
            name = getattr(plugin, "__name__", None) or type(plugin).__name__
            self._register(plugin, name, f"registered directly ({name})")
        self._entries = self._collect()

    # --- loading -----------------------------------------------------------

    def _load(self, entry_point):
        origin = _origin(entry_point)
        try:
            plugin = entry_point.load()
        except Exception as e:  # any import-time failure of third-party code
            self.broken.append(BrokenPlugin(entry_point.name, origin, "import", e))
            return
        self._register(plugin, entry_point.name, origin)

    def _register(self, plugin, name, origin):
        if self.manager.has_plugin(name):
            other = self._origins[name]
            error = RegistryError(f"two plugins are named {name!r}: {other} and {origin}")
            self.broken.append(BrokenPlugin(name, origin, "import", error))
            return
        try:
            self.manager.register(plugin, name=name)
        except Exception as e:  # pluggy validates hook signatures here
            self.broken.append(BrokenPlugin(name, origin, "import", e))
            return
        self._origins[name] = origin

    def _collect(self):
        entries = {}
        # Each plugin is called on its own (not through hook.register_tasks(),
        # which would stop at the first exception) so that a failure is
        # attributed to its plugin and the other plugins' tasks survive.
        impls = sorted(self.manager.hook.register_tasks.get_hookimpls(), key=lambda i: i.plugin_name)
        for impl in impls:
            name, origin = impl.plugin_name, self._origins[impl.plugin_name]
            found = []

            def register(task, _found=found):
                if not isinstance(task, Task):
                    raise TypeError(f"register() takes a kgpt.Task, got {type(task).__name__}")
                _found.append(task)

            try:
                impl.function(register=register)
            except Exception as e:
                self.broken.append(BrokenPlugin(name, origin, "register_tasks", e))
                continue
            for task in found:
                entry = TaskEntry(task, name, origin)
                if task.name in self.conflicts:
                    self.conflicts[task.name].append(entry)
                elif task.name in entries:
                    self.conflicts[task.name] = [entries.pop(task.name), entry]
                else:
                    entries[task.name] = entry
        return entries

    # --- lookup ------------------------------------------------------------

    def names(self):
        """Sorted names of the usable tasks."""
        return sorted(self._entries)

    def entries(self):
        """`TaskEntry` of every usable task, sorted by name."""
        return [self._entries[n] for n in self.names()]

    def __contains__(self, name):
        return name in self._entries

    def entry(self, name):
        """The `TaskEntry` for `name`; `RegistryError` explaining why there is none."""
        if name in self._entries:
            return self._entries[name]
        if name in self.conflicts:
            claims = " and ".join(f"plugin {e.plugin!r} ({e.origin})" for e in self.conflicts[name])
            raise RegistryError(f"Task {name!r} is registered by two plugins: {claims}. Uninstall one of them.")
        for broken in self.broken:
            if broken.plugin == name:
                raise RegistryError(f"Task {name!r} is unavailable: {broken.describe()}") from broken.error
        message = f"Unknown task {name!r}."
        close = difflib.get_close_matches(name, self.names() + list(self.conflicts), n=1)
        if close:
            message += f" Did you mean {close[0]!r}?"
        message += f" Available: {', '.join(self.names()) or '(none)'}."
        if self.broken:
            message += " Broken plugins that may provide it: " + "; ".join(b.describe() for b in self.broken)
            raise RegistryError(message) from self.broken[0].error
        raise RegistryError(message)

    def get(self, name):
        """The `kgpt.Task` named `name` (see `entry` for the errors)."""
        return self.entry(name).task

    def problems(self):
        """One line per broken plugin and per conflicting task name."""
        lines = [b.describe() for b in self.broken]
        for name, claims in sorted(self.conflicts.items()):
            lines.append(f"task {name!r} is claimed by " + " and ".join(repr(e.plugin) for e in claims))
        return lines

    def describe(self):
        """The `kgpt-train --list_tasks` table, with problems listed after it."""
        rows = [("task", "plugin", "kind", "head", "labels", "metrics", "paper")]
        for e in self.entries():
            t = e.task
            labels = ",".join(t.head.output_names()) if t.head.output_names() else "-"
            if t.head.pooling == "each":
                labels = f"{t.transform.num_views} choices"
            metric_names = ",".join(t.metric_names)
            rows.append((t.name, e.plugin, t.transform.kind, t.head.kind, labels, metric_names, t.paper_score))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        problems = self.problems()
        if problems:
            lines.append("")
            lines.append(f"{len(problems)} problem(s):")
            lines.extend("  " + p for p in problems)
        return "\n".join(lines)

    def format_traceback(self, plugin):
        """Full traceback of a broken plugin's error, for debugging it."""
        for broken in self.broken:
            if broken.plugin == plugin:
                return "".join(traceback.format_exception(broken.error))
        raise RegistryError(f"Plugin {plugin!r} is not broken.")
