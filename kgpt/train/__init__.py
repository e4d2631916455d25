"""How a model is trained: the paper's optimizer and schedule, data-parallel and dtype scopes,
checkpoints that resume exactly, and the training callbacks.
"""
