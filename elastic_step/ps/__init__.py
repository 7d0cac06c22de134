"""Parameter servers: each holds one shard of the model and applies gradients to it."""
