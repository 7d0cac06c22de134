"""The evaluation report: a self-contained HTML file with plots of an evaluation and of the
training job that produced the model."""

from elastic_step.report.inputs import load_summary
from elastic_step.report.page import write_report

__all__ = ["load_summary", "write_report"]
