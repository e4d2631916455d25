"""What a training run adds around `fit`: checkpoints that resume exactly and the training callbacks
(progress, non-finite loss, preemption).
"""
