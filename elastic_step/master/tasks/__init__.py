"""The tasks: the data cut into tasks (:mod:`.task_groups`), handed out and taken back under
leases (:mod:`.task_manager`, :mod:`.task_leases`), evaluation rounds
(:mod:`.evaluation_rounds`, :mod:`.evaluation`), and the sizes the master chooses for a task
(:mod:`.task_size`) and for a worker's local steps (:mod:`.local_steps`), and the job's last
task, the model save (:mod:`.model_save`). What other rooms use is in :mod:`.api`.

May import: no other room.
"""
