"""The task API that plugins build on: the `Task`/`Example` contract, the four input transformations,
heads, metrics, the hook specifications and the registry that discovers plugins.
"""
