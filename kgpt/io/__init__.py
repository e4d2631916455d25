"""Models on disk: kgpt presets, the original release's and Hugging Face's formats, SavedModel export,
and the starting points for fine-tuning.
"""
