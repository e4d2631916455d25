"""Keras layers the models are made of: the decoder block, fused dropout and flash attention, the task
views, LoRA and int8."""
