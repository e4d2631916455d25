"""Every kgpt plugin hook, in one place.

A plugin is a module (or object) with functions marked `@kgpt.hookimpl`,
advertised through the `kgpt` entry-point group of its distribution:

```toml
[project.entry-points.kgpt]
boolq = "kgpt_boolq"
```

kgpt's built-in tasks are registered the same way (see `tasks/`).
"""

from typing import Callable

import pluggy

from kgpt.task import Task

PROJECT = "kgpt"
ENTRY_POINT_GROUP = "kgpt"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_tasks(register: Callable[[Task], None]) -> None:
    """Register fine-tuning tasks by calling `register(task)` once per `kgpt.Task`.

    Called once per plugin when the registry is built. A task name may be
    registered by one plugin only; a second claim is reported as a conflict
    naming both plugins.
    """
