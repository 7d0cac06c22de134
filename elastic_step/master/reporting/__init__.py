"""What the job reports: a copy of what it shows taken under the coordinator's lock
(:mod:`.api`'s ``JobView``), status.json and summary.json (:mod:`.reports`, their fields in
:mod:`.report_fields`), TensorBoard events (:mod:`.tensorboard_events`, :mod:`.scalar_series`)
and Prometheus metrics (:mod:`.metrics_endpoint`).

May import: tasks, instances, job_state.
"""
