"""Pipeline components of elastic-step: preprocess, elastic-train, evaluate and batch-predict,
for Kubeflow Pipelines v2 (kfp_components.py) and Argo Workflows (argo_templates.py).

Both run the ``elastic-step`` command in the project's image (:data:`IMAGE`, built from the
Containerfile), which installs nothing at run time. Their parameters are the command's flags,
under the same names and with the same defaults (parameters.py names the deviations).
``python -m pipelines.render`` writes the committed YAML under components/ and
pipelines/.
"""

from elastic_step import __version__

#: The image every component runs in; docs/guides/pipelines.md says how to use your own build.
IMAGE = f"ghcr.io/elastic-step/elastic-step:{__version__}"
