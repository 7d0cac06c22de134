"""The Beam runner that ``--beam-option=--runner=...`` names, made ready before the pipeline's
options are checked (beam_preprocess.pipeline_options).

- **Short names that Beam does not resolve.** Beam knows ``DataflowRunner`` or ``PrismRunner``
  by name, but its Dask runner only by its class path; ``DaskRunner`` (or ``dask``) is taken
  here as Beam takes its own short names.
- **Options of a runner's own module.** Beam learns a runner's options (the Dask runner's
  ``--dask_client_address``) only once that module is imported, so it is imported first: else
  those options would be refused as unknown.
- **Dask's partitions.** See :func:`one_item_a_task`.
- **Prism's binary.** Without ``--prism_location`` Beam downloads Prism from GitHub when the job
  starts. Here it is looked up where ``make prism`` builds it (or ``$ELASTIC_STEP_PRISM``), and
  a missing binary is one line that says how to build it: nothing is downloaded at run time.

Tests: tests/unit/test_beam_preprocess.py, tests/beam/.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from elastic_step.errors import InputError

#: Runners known here by a short name (lower case), by their class path.
SHORT_NAMES = {
    "dask": "apache_beam.runners.dask.dask_runner.DaskRunner",
    "daskrunner": "apache_beam.runners.dask.dask_runner.DaskRunner",
}
#: What the Dask runner needs beside Beam.
DASK_MISSING = "needs Dask: pip install 'apache-beam[dask]' (dask and distributed)"
PRISM_ENV = "ELASTIC_STEP_PRISM"


def resolve(runner: str | None) -> str | None:
    """The runner's class path for the short names of :data:`SHORT_NAMES`; else ``runner``."""
    if runner is None:
        return None
    return SHORT_NAMES.get(runner.lower(), runner)


def import_runner_module(runner: str) -> None:
    """Imports the module of a runner given by its class path, so that Beam knows its options;
    an :class:`InputError` of one line when it cannot be imported."""
    if "." not in runner:
        return
    module = runner.rsplit(".", 1)[0]
    try:
        importlib.import_module(module)
    except ImportError as e:
        needs = DASK_MISSING if module.startswith("apache_beam.runners.dask") else str(e)
        raise InputError(f"--beam-option --runner={runner}: {needs}") from None


def is_dask(runner: str | None) -> bool:
    return runner == SHORT_NAMES["dask"]


def one_item_a_task(options: Any) -> None:
    """On Dask, each item of a pass its own task (beam_stages.py), unless the options say how
    to partition: the Dask runner's ``Create`` puts up to 128 items in one task, which would
    run a pass's every range on one worker."""
    from apache_beam.runners.dask.dask_runner import DaskOptions

    dask = options.view_as(DaskOptions)
    if dask.npartitions is None and dask.partition_size is None:
        dask.partition_size = 1


def is_prism(runner: str | None) -> bool:
    return runner is not None and runner.rsplit(".", 1)[-1].lower() in ("prism", "prismrunner")


def prism_binary() -> str:
    """Where Prism's binary is: ``$ELASTIC_STEP_PRISM``, else where ``make prism`` builds the
    version of the Beam installed (the Makefile's PRISM_DIR)."""
    if os.environ.get(PRISM_ENV):
        return os.environ[PRISM_ENV]
    from apache_beam.version import __version__

    cache = os.environ.get("ELASTIC_STEP_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "elastic-step"
    )
    return os.path.join(cache, "prism", f"v{__version__}", "prism")


def prism_location(given: str | None) -> str:
    """The ``--prism_location`` to run with: ``given``, which must exist, or the binary that
    ``make prism`` built; an :class:`InputError` of one line when there is none."""
    if given:
        if "://" not in given and not os.path.exists(given):
            raise InputError(f"--beam-option --prism_location={given}: no such file")
        return given
    path = prism_binary()
    if not os.access(path, os.X_OK):
        raise InputError(
            f"--beam-option --runner=PrismRunner: Prism's binary is not at {path}; build it "
            f"with `make prism`, or give it with --beam-option=--prism_location=PATH or "
            f"${PRISM_ENV} (Beam would download it from GitHub)"
        )
    return path
