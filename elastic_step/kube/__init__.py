"""The one Kubernetes API client of elastic-step, for the backend and the state store alike.

- :mod:`elastic_step.kube.client`: the one module that constructs API clients (in-cluster
  or from a kubeconfig), and finds the default namespace;
- :mod:`elastic_step.kube.calls`: the one retrying call, with one backoff policy, and
  :class:`~elastic_step.kube.calls.KubeError`, one line naming verb, resource and namespace;
- :mod:`elastic_step.kube.objects`: get-or-None, create, patch and delete of ConfigMaps,
  Secrets and Leases, through that call.

A ground-floor package: it imports only ``elastic_step.errors`` and third-party libraries.
Nothing here is imported by this ``__init__``: a dry run must not load the kubernetes client.
Tests: tests/unit/test_kube_calls.py, tests/unit/test_kube_client.py.
"""
