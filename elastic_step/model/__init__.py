"""The model layer: defining, building, placing, optimizing, saving and serving a model.
Its interface is in :mod:`elastic_step.model.api`."""
