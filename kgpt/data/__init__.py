"""Data plumbing, no model: the dataset readers (`file:line` errors), your own tables, text
normalisation helpers, token shards for pre-training, length batching and the demo corpus.
"""
