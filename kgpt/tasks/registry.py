"""Task discovery: a pluggy plugin manager fed from the `kgpt` entry points.

Entry points are loaded one by one here rather than with pluggy's
`load_setuptools_entrypoints`, which stops at the first plugin that fails to
import. Whatever a plugin raises while it is imported or registers its tasks
(`SystemExit` included; only Ctrl-C goes through) is recorded with its name,
entry point and error, and every other task keeps working; asking for a task
of that plugin raises `RegistryError` with that report.

Names (see tasks/README.md):
- a plugin is its distribution plus its entry-point name, so a third-party
  entry point named `glue` loads beside the built-in `glue`;
- a task name of a built-in plugin stays the built-in's: a third-party claim
  on it is ignored and reported;
- a task name claimed by two third-party plugins is refused, naming both,
  until one of them is uninstalled;
- a plugin with a `@kgpt.hookimpl` that matches no hook (a misspelt name) is
  refused, and one that registers no task is reported.

```python
registry = kgpt.TaskRegistry()        # built-in + installed plugins
registry.names()                      # ['boolq', 'scitail', ...]
task = registry.get("scitail")
```
Tests pass plugin objects directly: `TaskRegistry(plugins=[obj], entry_points=[])`.
"""

import copy
import dataclasses
import difflib
import importlib.metadata
import logging
import re
import traceback

import pluggy

from kgpt.errors import RegistryError
from kgpt.tasks import hookspecs
from kgpt.tasks.task import Task, describe_error

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TaskEntry:
    """A registered task and the plugin that registered it."""

    task: Task
    plugin: str  # plugin (entry point) name
    origin: str  # e.g. "entry point scitail = kgpt_tasks.scitail (kgpt 0.1.0)"
    builtin: bool = False  # declared by kgpt itself
    distribution: str = ""


@dataclasses.dataclass(frozen=True)
class BrokenPlugin:
    """A plugin that failed to import or to register its tasks, or that kgpt refused."""

    plugin: str
    origin: str
    stage: str  # "entry points", "import", "hooks" or "register_tasks"
    error: BaseException
    tasks: tuple = ()  # names it registered before failing, refused with it

    def describe(self):
        if isinstance(self.error, RegistryError):  # found by kgpt, not raised by the plugin
            return f"plugin {self.plugin!r} ({self.origin}): {self.error}"
        return f"plugin {self.plugin!r} ({self.origin}) failed in {self.stage}: {describe_error(self.error)}"


@dataclasses.dataclass(frozen=True)
class _Plugin:
    name: str
    origin: str
    builtin: bool = False
    distribution: str = ""


def _origin(entry_point):
    dist = getattr(entry_point, "dist", None)
    where = f" ({dist.name} {dist.version})" if dist is not None else ""
    return f"entry point {entry_point.name} = {entry_point.value}{where}"


def _distribution(entry_point):
    dist = getattr(entry_point, "dist", None)
    return dist.name if dist is not None else ""


def _key(entry_point):
    """The pluggy name: distribution and entry point, so two distributions' `glue` both load."""
    return f"{_distribution(entry_point) or entry_point.value}:{entry_point.name}"


def _canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _is_builtin(entry_point):
    return _canonical(_distribution(entry_point)) == "kgpt"


def _run(fn, *args, **kwargs):
    """`(fn(...), None)`, or `(None, error)` for whatever plugin code raises but Ctrl-C."""
    try:
        return fn(*args, **kwargs), None
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # SystemExit too: a plugin must not end kgpt
        return None, e


def _lookalikes(plugin, hooks):
    """Callables of `plugin` named like a kgpt hook that pluggy did not take (misspelt or unmarked)."""
    names = [n for n in dir(plugin) if not n.startswith("_") and callable(getattr(plugin, n, None))]
    return [
        n
        for n in names
        if n in hooks or n.startswith(f"{hookspecs.PROJECT}_") or difflib.get_close_matches(n, hooks, n=1, cutoff=0.8)
    ]


class TaskRegistry:
    """All tasks from plugins: entry points of group `kgpt`, plus `plugins` given directly.

    Args:
        plugins: extra plugin objects (modules or instances with
            `@kgpt.hookimpl` functions), registered under their `__name__`
            or class name, as third-party plugins.
        entry_points: `None` to discover installed entry points; an iterable
            of `importlib.metadata.EntryPoint` to use those instead (`[]`
            for none).
    """

    def __init__(self, plugins=(), entry_points=None):
        self.manager = pluggy.PluginManager(hookspecs.PROJECT)
        self.manager.add_hookspecs(hookspecs)
        self._hooks = sorted(n for n in vars(self.manager.hook) if not n.startswith("_"))  # only specs so far
        self.broken = []
        self.conflicts = {}  # task name -> [TaskEntry, ...] (two or more third-party claims)
        self.overruled = []  # (third-party TaskEntry, built-in TaskEntry) claiming one task name
        self._warned = set()  # overruled plugins already reported by entry()
        self._plugins = {}  # pluggy name -> _Plugin
        if entry_points is None:
            entry_points = self._discover()
        for entry_point in sorted(entry_points, key=lambda ep: (ep.name, ep.value)):
            self._load(entry_point)
        for plugin in plugins:
            name = getattr(plugin, "__name__", None) or type(plugin).__name__
            self._register(plugin, name, _Plugin(name, f"registered directly ({name})"))
        self._refuse_unknown_hooks()
        self._entries = self._collect()

    # --- loading -----------------------------------------------------------

    def _discover(self):
        """The `kgpt` entry points of the installed distributions, as `importlib.metadata.entry_points` finds them.

        Read one distribution at a time, since one malformed entry_points.txt
        makes `entry_points()` raise for all of them.
        """
        group, found, seen = hookspecs.ENTRY_POINT_GROUP, [], set()
        for dist in importlib.metadata.distributions():
            # The first of a name on sys.path wins, as in entry_points().
            key = getattr(dist, "_normalized_name", None) or _canonical(dist.name or "")
            if key in seen:
                continue
            seen.add(key)
            points, error = _run(lambda: dist.entry_points.select(group=group))  # noqa: B023 - called at once, in this iteration
            if error is None:
                found.extend(points)
            elif f"[{group}]" in (dist.read_text("entry_points.txt") or ""):
                report = RegistryError(
                    f"its entry_points.txt cannot be read ({describe_error(error)}); reinstall or uninstall it"
                )
                report.__cause__ = error
                self._fail(_Plugin(dist.name, f"distribution {dist.name} {dist.version}"), "entry points", report)
        return found

    def _fail(self, info, stage, error, tasks=()):
        self.broken.append(BrokenPlugin(info.name, info.origin, stage, error, tasks))

    def _load(self, entry_point):
        info = _Plugin(entry_point.name, _origin(entry_point), _is_builtin(entry_point), _distribution(entry_point))
        plugin, error = _run(entry_point.load)
        if error is not None:
            self._fail(info, "import", error)
            return
        self._register(plugin, _key(entry_point), info)

    def _register(self, plugin, key, info):
        if key in self._plugins:
            error = RegistryError(
                f"two plugins are named {info.name!r}: {self._plugins[key].origin} and {info.origin}; uninstall one"
            )
            self._fail(info, "import", error)
            return
        _, error = _run(self.manager.register, plugin, name=key)
        if error is not None:  # pluggy validates hook signatures here
            if self.manager.get_plugin(key) is not None:  # pluggy keeps what it added before the error
                self.manager.unregister(name=key)
            if isinstance(error, pluggy.PluginValidationError):
                report = RegistryError(self._signature_message(error))
                report.__cause__ = error
                self._fail(info, "hooks", report)
            else:
                self._fail(info, "import", error)
            return
        self._plugins[key] = info

    def _signature_message(self, error):
        """What is wrong with a hook pluggy refused: its arguments, beside the ones kgpt passes."""
        lines = [line for line in str(error).splitlines() if line.startswith("hookimpl definition:")]
        found = lines[0].split(":", 1)[1].strip() if lines else "a hook"
        wanted = [f"{name}({', '.join(getattr(self.manager.hook, name).spec.argnames)})" for name in self._hooks]
        return (
            f"@kgpt.hookimpl {found} does not take the arguments kgpt passes ({', '.join(wanted)}); "
            f"a hook may take fewer of them, by these names, but no other, so the plugin is not loaded"
        )

    def _refuse_unknown_hooks(self):
        """Unregisters plugins with a `@kgpt.hookimpl` that matches no hookspec: a misspelt hook does nothing.

        pluggy's `check_pending` rule (`optionalhook=True` is exempt), applied
        per plugin so that every such plugin is reported and the rest load.
        """
        unknown = {}
        for name, caller in vars(self.manager.hook).items():
            if name.startswith("_") or caller.has_spec():
                continue
            for impl in caller.get_hookimpls():
                if not impl.optionalhook:
                    unknown.setdefault(impl.plugin_name, []).append(name)
        for key, names in sorted(unknown.items()):
            self.manager.unregister(name=key)
            self._fail(self._plugins.pop(key), "hooks", RegistryError(self._unknown_hooks_message(names)))

    def _unknown_hooks_message(self, names):
        described = []
        for name in sorted(names):
            close = difflib.get_close_matches(name, self._hooks, n=1)
            described.append(f"{name} (did you mean {close[0]}?)" if close else name)
        return (
            f"@kgpt.hookimpl {', '.join(described)} is no kgpt hook (kgpt has {', '.join(self._hooks)}), so "
            f"the plugin is not loaded; rename it, or mark it @kgpt.hookimpl(optionalhook=True) if another "
            f"kgpt version defines it"
        )

    def _collect(self):
        entries = {}
        impls = {impl.plugin_name: impl for impl in self.manager.hook.register_tasks.get_hookimpls()}
        # Built-ins first, so that a third-party claim never takes one of their task names.
        for key, info in sorted(self._plugins.items(), key=lambda item: (not item[1].builtin, item[0])):
            for task in self._tasks_of(key, info, impls.get(key)):
                plugin = f"plugin {info.name!r} ({info.origin})"
                self._claim(
                    entries, TaskEntry(_labelled(task, plugin), info.name, info.origin, info.builtin, info.distribution)
                )
        return entries

    def _tasks_of(self, key, info, impl):
        """The tasks the plugin registers; `[]` with a report when it fails or registers none.

        Each plugin is called on its own (not through hook.register_tasks(),
        which would stop at the first exception) so that a failure is
        attributed to its plugin and the other plugins' tasks survive.
        """
        if impl is None:
            self._fail(info, "register_tasks", RegistryError(self._no_hook_message(self.manager.get_plugin(key))))
            return []
        found = []

        def register(task):
            if not isinstance(task, Task):
                raise TypeError(f"register() takes a kgpt.Task, got {type(task).__name__}")
            found.append(task)

        _, error = _run(impl.function, register=register)
        if error is not None:
            self._fail(info, "register_tasks", error, tasks=tuple(t.name for t in found))
            return []
        if not found:
            self._fail(
                info,
                "register_tasks",
                RegistryError("registered no task: its register_tasks never called register(task)"),
            )
        return found

    def _no_hook_message(self, plugin):
        message = "registered no task: it has no @kgpt.hookimpl def register_tasks(register)"
        names, _ = _run(_lookalikes, plugin, self._hooks)
        if names:
            message += f"; {', '.join(names)} is misspelt or lacks @kgpt.hookimpl"
        return message

    def _claim(self, entries, entry):
        """Adds `entry` unless its task name is taken: a built-in keeps it, two third-party claims are refused."""
        name = entry.task.name
        held = entries.get(name)
        if name in self.conflicts:
            self.conflicts[name].append(entry)
        elif held is None:
            entries[name] = entry
        elif held.builtin and not entry.builtin:
            self.overruled.append((entry, held))
        else:
            self.conflicts[name] = [entries.pop(name), entry]

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
            self._warn_ignored(name)
            return self._entries[name]
        if name in self.conflicts:
            claims = " and ".join(f"plugin {e.plugin!r} ({e.origin})" for e in self.conflicts[name])
            raise RegistryError(f"Task {name!r} is registered by two plugins: {claims}. Uninstall one of them.")
        for broken in self.broken:
            if name == broken.plugin or name in broken.tasks:
                raise RegistryError(
                    f"Task {name!r} is unavailable: {broken.describe()}. Fix or uninstall that plugin."
                ) from broken.error
        message = f"Unknown task {name!r}."
        known = self.names() + list(self.conflicts)
        # Case first: difflib finds no match for "SST2" among "sst2" and its neighbours.
        close = [n for n in known if n.casefold() == name.casefold()] or difflib.get_close_matches(
            name.casefold(), known, n=1
        )
        if close:
            message += f" Did you mean {close[0]!r}?"
        message += f" Available: {', '.join(self.names()) or '(none)'}."
        if self.broken:
            message += " Broken plugins that may provide it: " + "; ".join(b.describe() for b in self.broken)
            raise RegistryError(message) from self.broken[0].error
        raise RegistryError(message)

    def _warn_ignored(self, name):
        """Says once that a third-party task of this name was ignored: `--task NAME` runs the built-in."""
        for entry, builtin in self.overruled:
            if entry.task.name == name and (entry.plugin, entry.origin) not in self._warned:
                self._warned.add((entry.plugin, entry.origin))
                logger.warning(
                    f"Task {name!r} is the built-in one of plugin {builtin.plugin!r}; plugin "
                    f"{entry.plugin!r} ({entry.origin}) also registers a task {name!r}, which is ignored: "
                    f"rename it in that plugin to use it."
                )

    def get(self, name):
        """The `kgpt.Task` named `name` (see `entry` for the errors)."""
        return self.entry(name).task

    def problems(self):
        """One line per broken plugin, per ignored claim on a built-in task and per conflicting task name."""
        lines = [b.describe() for b in self.broken]
        for entry, builtin in self.overruled:
            lines.append(
                f"task {entry.task.name!r} of plugin {entry.plugin!r} ({entry.origin}) is ignored: the "
                f"built-in plugin {builtin.plugin!r} has that name; rename the task"
            )
        for name, claims in sorted(self.conflicts.items()):
            lines.append(
                f"task {name!r} is claimed by "
                + " and ".join(f"{e.plugin!r} ({e.origin})" for e in claims)
                + "; uninstall one"
            )
        return lines

    def _plugin_label(self, entry):
        """The plugin column: its name, with its distribution when another plugin has that name."""
        shared = sum(info.name == entry.plugin for info in self._plugins.values()) > 1
        return f"{entry.plugin} ({entry.distribution})" if shared and entry.distribution else entry.plugin

    def describe(self):
        """The `kgpt-train --list_tasks` table, with problems listed after it."""
        rows = [("task", "plugin", "kind", "head", "labels", "metrics", "paper")]
        for e in self.entries():
            t = e.task
            labels = ",".join(t.head.output_names()) if t.head.output_names() else "-"
            if t.head.pooling == "each":
                labels = f"{t.transform.num_views} choices"
            metric_names = ",".join(t.metric_names)
            rows.append(
                (t.name, self._plugin_label(e), t.transform.kind, t.head.kind, labels, metric_names, t.paper_score)
            )
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


def _labelled(task, plugin):
    """A copy of `task` naming `plugin` in its reading errors; the plugin's own object is left as it is."""
    task = copy.copy(task)
    object.__setattr__(task, "plugin", plugin)  # a frozen dataclass
    return task
