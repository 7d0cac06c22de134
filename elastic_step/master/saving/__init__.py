"""The saved models: a round's best model pulled from the PS and kept aside
(:mod:`.best_model`; the job's model is written by a worker, see
:mod:`~elastic_step.master.tasks.model_save`), which round is best and when training stops
early (:mod:`.api`), and who owns an output directory (:mod:`.output_owner`). When to save is
the root's :mod:`~elastic_step.master.model_saving`.

May import: no other room.
"""
