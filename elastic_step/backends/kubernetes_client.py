"""The backend's Kubernetes client: :mod:`elastic_step.kube`'s calls, raising KubeCallError.

The calls, their retry policy and their one-line errors are elastic_step/kube/calls.py's;
this module only makes their errors a :class:`BackendError` for the backend's callers.
Tests: tests/unit/test_kube_calls.py, tests/unit/test_kubernetes_watch.py.
"""

from __future__ import annotations

from elastic_step.backends.api import BackendError
from elastic_step.kube.calls import KubeCalls, KubeError


class KubeCallError(KubeError, BackendError):
    """A refused or failed API call of the backend; ``str()`` is one line naming verb,
    resource, namespace (see :class:`KubeError`)."""


class Kube(KubeCalls):
    """The API of the job's namespace, with errors raised as :class:`KubeCallError`."""

    error = KubeCallError
