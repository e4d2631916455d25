"""Files: local and remote storage with atomic writes (`storage`), the kgpt preset format and its
checks (`presets`), what marks a run's output directory (`run_folder`), and SavedModel export
(`export`). Nothing here builds a model.
"""
