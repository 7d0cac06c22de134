"""The job's state: the coordinator that holds it and decides on it behind one lock
(:mod:`.coordinator`), the job record (:mod:`.job_record`), and how both go to the state store
and come back after a restart (:mod:`.persistence`). What other rooms use is in :mod:`.api`.

May import: tasks, instances, saving, state_store.
"""
