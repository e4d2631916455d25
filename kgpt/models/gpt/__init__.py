"""GPT-1: its backbone, tokenizer, preprocessors, causal LM and task model, named as keras-hub names a model's files."""
