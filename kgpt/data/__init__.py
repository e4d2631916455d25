"""Text to model inputs: the GPT-1 tokenizer, token shards for pre-training, the dataset readers
(`file:line` errors), length batching and the two preprocessors.
"""
