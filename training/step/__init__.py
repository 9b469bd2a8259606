"""The training step and the model: the loop, megatron-core's model and parallel layout, and megatron on CPU."""
