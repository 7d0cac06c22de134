"""The instances: the workers and PS a job runs. :mod:`.instance_manager` keeps the members
and replaces what ends, by :mod:`.process_state`'s transition table and
:mod:`.relaunch_policy`'s limits; :mod:`.instance_names` names them, :mod:`.launch` and
:mod:`.job_keys` say how one starts and proves who it is, :mod:`.sizing_ledger` feeds the
worker sizing policy, and :mod:`.model_copies` says whether an empty PS shard can be refilled.
What other rooms use is in :mod:`.api`.

May import: worker_sizing.
"""
