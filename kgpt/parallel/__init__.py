"""Processes and devices: joining the other processes of a run (`cluster`), data- and model-parallel
layouts and dtype scopes (`distribute`), and the repairs Keras' TensorFlow trainer needs under a
multi-worker strategy (`multi_worker`). Below the models, which gather predictions through it.
"""
