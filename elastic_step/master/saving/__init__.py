"""The saved models: how a model is pulled from the PS and written (:mod:`.final_model`), a
round's best model kept aside (:mod:`.best_model`), which round is best and when training
stops early (:mod:`.api`), and who owns an output directory (:mod:`.output_owner`). When to
save is the root's :mod:`~elastic_step.master.model_saving`.

May import: no other room.
"""
