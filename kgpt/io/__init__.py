"""Files: local and remote storage with atomic writes (`storage`), the kgpt preset format and its
checks (`presets`), and SavedModel export (`export`). Nothing here builds a model.
"""
