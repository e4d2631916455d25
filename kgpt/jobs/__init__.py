"""The jobs behind the commands: pre-training, fine-tuning and prediction, and the run directory
they write to.
"""
