"""How the models train and what a training run adds around `fit`: the LM loss (`lm_loss`, `loss_trackers`),
the paper's optimizer and schedule (`optimizers`), a compilation's measured cost (`compile_cost`), checkpoints
that resume exactly and the training callbacks (progress, non-finite loss, preemption).
"""
