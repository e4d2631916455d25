"""The paper's zero-shot evaluation (section 5): each task's heuristic scored through training.

The heuristics themselves are part of the task contract (`kgpt.tasks.heuristics`); the studies that
train models (transfer depth, the Table 5 ablations) are jobs (`kgpt.jobs.experiments`).
"""
