"""The master: hands out tasks, runs and replaces workers and PS, and persists its state.

Its root holds the job itself: :mod:`.job` runs a job's life (lease, resume, server, loop,
stop), a :class:`~.job_kind.JobKind` says what it computes (:mod:`.training_job`,
:mod:`.prediction_job`), :mod:`.config` holds its parameters, :mod:`.servicer` answers the
workers and PS, :mod:`.job_reporter` writes what it shows, :mod:`.model_saving` says when the
model is saved, and :mod:`.teardown` stops what is left.

Below it, rooms by concern, each a subpackage whose docstring says what it holds and which
rooms it may import (tests/unit/test_import_graph.py holds them to it). No room imports the
root, and the rooms import each other in this order only (each may import those before it):

- ``tasks``: the data cut into tasks, handed out under leases, evaluation rounds, the model
  save that a worker runs;
- ``saving``: a round's model kept aside, which round is the best, who owns the output;
- ``state_store``: where the state is journalled (files, or ConfigMaps and a Lease);
- ``worker_sizing``: how many workers a job wants;
- ``instances``: the workers and PS, their states, relaunches and launch specs;
- ``job_state``: the coordinator, the job record, and how both persist;
- ``reporting``: status.json, summary.json, TensorBoard events and Prometheus metrics;
- ``tracking``: the MLflow run.
"""
