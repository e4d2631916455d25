"""kgpt's built-in task plugins (installed as `kgpt_tasks`).

Each module is registered through kgpt's own `kgpt` entry points in
pyproject.toml, exactly as a third-party plugin is, so a broken module only
takes its own tasks down.
"""
