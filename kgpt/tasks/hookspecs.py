"""Every kgpt plugin hook, in one place.

A plugin is a module (or object) with functions marked `@kgpt.hookimpl`,
advertised through the `kgpt` entry-point group of its distribution:

```toml
[project.entry-points.kgpt]
boolq = "kgpt_boolq"
```

kgpt's built-in tasks are registered the same way (see `tasks/`). A
`@kgpt.hookimpl` whose name is not a hook below refuses its plugin (it would
do nothing); one meant for another kgpt version is marked
`@kgpt.hookimpl(optionalhook=True)`.
"""

from collections.abc import Callable

import pluggy

from kgpt.tasks.task import Task

PROJECT = "kgpt"
ENTRY_POINT_GROUP = "kgpt"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_tasks(register: Callable[[Task], None]) -> None:
    """Register fine-tuning tasks by calling `register(task)` once per `kgpt.Task`.

    Called once per plugin when the registry is built; a plugin that
    registers no task is reported. A task name belongs to one plugin: a
    built-in task keeps its name (another plugin's claim is ignored and
    reported), and a name two other plugins claim is refused for both,
    naming them, until one is uninstalled.
    """
