"""Kubeflow Pipelines' own UI (tests/cluster/kfp_ui.py) in headless Chromium, used as a
person uses it: upload the compiled example pipeline, create a run with the example's
inputs, wait on the run's page until it has finished, then open the training step's metrics,
evaluate's confusion matrix and its HTML report. The UI reads the first two from ML Metadata
(over gRPC-web) and the report from the object store.

The screenshots are checked as the report's browser test checks its own: the text in the
page, and the colours inside the DOM boxes of what was drawn. They stay in the test's
directory (``--basetemp``) for a look.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from headless_chromium import HeadlessChromium, pixels_of
from kfp_helpers import (
    CSV_URI,
    EXAMPLE_PACKAGE,
    KFP_BUCKET,
    MODEL_DEF_URI,
    TRAIN_TASK,
    train_output_keys,
)

WIDTH, HEIGHT = 1400, 1000
#: What the form gets: the example's inputs, and a small job for the test node.
RUN_PARAMETERS = {
    "csv_uri": CSV_URI,
    "label": "benign",
    "model_def_uri": MODEL_DEF_URI,
    "epochs": "2",
    "max_workers": "2",
}
#: The Scalar Metrics table of the training step's metrics (name, value), not the properties
#: table of the Artifact Info tab, which names the same metrics.
SCALAR_METRICS_TABLE = """[...document.querySelectorAll('table')].filter(t =>
    t.getClientRects().length > 0
    && /name[\\s\\S]*value/.test(t.querySelector('thead')?.innerText || '')
    && t.innerText.includes('examples_per_second')).pop()"""
#: How long to wait on a run's page: a run of the example takes about a minute.
RUN_TIMEOUT_S = 600

pytestmark = pytest.mark.filterwarnings("ignore:This client only works:FutureWarning")


class Page:
    """The UI in one browser tab, with what a person does in it."""

    def __init__(self, browser: HeadlessChromium, url: str, shots: Path) -> None:
        self.browser, self.url, self.shots = browser, url, shots

    def go(self, route: str) -> None:
        self.browser.load(f"{self.url}/#{route}")

    def reload(self) -> None:
        since = len(self.browser.events)
        self.browser.call("Page.reload", ignoreCache=True)
        self.browser.wait_for_event("Page.loadEventFired", since=since)

    def wait(self, expression: str, timeout: float = 30, what: str = "") -> object:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.browser.evaluate(expression)
            if value:
                return value
            time.sleep(0.5)
        raise TimeoutError(f"waited {timeout} s for {what or expression}")

    def click(self, selector: str) -> None:
        self.wait(f"!!document.querySelector({selector!r})", what=selector)
        self.browser.evaluate(f"document.querySelector({selector!r}).click()")

    def click_text(self, tag: str, text: str, index: int = 0) -> None:
        """Clicks the ``index``-th ``tag`` element whose text is ``text``."""
        find = (
            f"[...document.querySelectorAll({tag!r})]"
            f".filter(e => e.innerText.trim() === {text!r})[{index}]"
        )
        self.wait(f"!!{find}", what=f"{tag} {text!r}")
        self.browser.evaluate(f"{find}.dispatchEvent(new MouseEvent('click', {{bubbles: true}}))")

    def type(self, selector: str, text: str) -> None:
        """Selects the field's text and types ``text`` over it, as keystrokes would."""
        self.wait(f"!!document.querySelector({selector!r})", what=selector)
        self.browser.evaluate(f"document.querySelector({selector!r}).select()")
        self.browser.call("Input.insertText", text=text)

    def choose_file(self, selector: str, path: Path) -> None:
        document = self.browser.call("DOM.getDocument", depth=-1, pierce=True)
        node = self.browser.call(
            "DOM.querySelector", nodeId=document["root"]["nodeId"], selector=selector
        )
        self.browser.call("DOM.setFileInputFiles", files=[str(path)], nodeId=node["nodeId"])

    def settled_box(self, element: str, what: str) -> dict:
        """The box of the element that the expression ``element`` finds, scrolled into view,
        once it stays put for half a second (the side panel slides in)."""
        measure = f"""(() => {{ const e = {element}; if (!e) return null;
            e.scrollIntoView({{block: 'nearest'}}); const r = e.getBoundingClientRect();
            return {{x: r.x, y: r.y, width: r.width, height: r.height}}; }})()"""
        deadline = time.monotonic() + 30
        last = None
        while time.monotonic() < deadline:
            box = self.browser.evaluate(measure)
            if box is not None and box == last:
                return box
            last = box
            time.sleep(0.5)
        raise TimeoutError(f"waited 30 s for {what} to settle (last box {last})")

    def text(self) -> str:
        return self.browser.evaluate("document.body.innerText")

    def shot(self, name: str) -> np.ndarray:
        png = self.browser.screenshot(width=WIDTH, height=HEIGHT)
        (self.shots / f"{name}.png").write_bytes(png)
        return tf.io.decode_png(png, channels=3).numpy().astype(int)


def upload_and_run(page: Page, pipeline_name: str) -> str:
    """Uploads the compiled example as a new pipeline and starts a run of it from the
    pipeline's page; the run's id (from the run page the UI then opens)."""
    page.go("/pipeline_versions/new")
    page.type("#newPipelineName", pipeline_name)
    page.click("#localPackageBtn")  # "Upload a file" (the form starts on "Import by url")
    page.choose_file("#dropZone input[type=file]", EXAMPLE_PACKAGE)
    page.wait("!document.querySelector('#createNewPipelineOrVersionBtn').disabled")
    page.shot("1-upload")
    page.click("#createNewPipelineOrVersionBtn")
    page.wait("location.hash.includes('/pipelines/details/')", what="the pipeline's page")
    page.click("#createNewRunBtn")
    for name, value in RUN_PARAMETERS.items():
        page.type(f"[id={name!r}]", value)
    page.wait("!document.querySelector('#startNewRunBtn').disabled", what="Start enabled")
    page.shot("2-new-run")
    page.click("#startNewRunBtn")
    found = page.wait(
        "location.hash.match(/runs\\/details\\/([0-9a-f-]+)/)?.[1]", what="the run's page"
    )
    return str(found)


def wait_on_run_page(page: Page) -> str:
    """The Status the run page's Detail tab shows once the run has ended, reading the page
    again every few seconds (as a person presses reload: the tab does not refresh it)."""
    status_js = """(() => { const t = document.body.innerText.split('\\nStatus\\n')[1];
                           const s = t && t.split('\\n')[0];
                           return ['Succeeded', 'Failed', 'Canceled'].includes(s) && s; })()"""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        page.reload()
        page.click_text("button", "Detail")
        try:
            status = page.wait(status_js, timeout=5, what="the run to end")
            break
        except TimeoutError:
            if time.monotonic() > deadline:
                raise
    page.click_text("button", "Graph")
    return str(status)


def open_visualization(page: Page, node: str, index: int = 0) -> None:
    """Clicks an artifact node of the run's graph and its Visualization tab."""
    page.click_text(".react-flow__node", node, index)
    page.click_text("button", "Visualization")


def dark_pixels(image: np.ndarray, box: dict) -> int:
    """Pixels of text (every channel below 100) inside ``box``."""
    top, left = int(box["y"]), int(box["x"])
    region = image[top : top + int(box["height"]), left : left + int(box["width"])]
    return int((region.max(axis=-1) < 100).sum())


# The whole KFP backend starts for the first KFP test of a session, and the run takes a minute.
@pytest.mark.timeout(600)
def test_a_person_uploads_the_pipeline_runs_it_and_sees_its_results(
    kfp, kfp_ui, s3_server, tmp_path
):
    shots = tmp_path / "screenshots"
    shots.mkdir()
    browser = HeadlessChromium(tmp_path / "profile", width=WIDTH, height=HEIGHT)
    try:
        page = Page(browser, kfp_ui.url, shots)
        run_id = upload_and_run(page, f"elastic-step-ui-{uuid.uuid4().hex[:6]}")
        assert wait_on_run_page(page) == "Succeeded", page.text()[-3000:]
        page.shot("3-run")
        artifacts = kfp.mlmd.artifacts_of_run(run_id)

        # Training's scalar metrics: the table shows what summary.json says.
        (train_metrics,) = [
            a for a in artifacts if a["type"] == "system.Metrics" and a["task"] == TRAIN_TASK
        ]
        graph_index = _graph_index(page, "metrics", train_metrics)
        open_visualization(page, "metrics", graph_index)
        table = page.settled_box(SCALAR_METRICS_TABLE, what="the Scalar Metrics table")
        table["rows"] = browser.evaluate(
            f"""[...{SCALAR_METRICS_TABLE}.querySelectorAll('tbody tr')]
                 .map(r => [...r.querySelectorAll('td')].map(c => c.innerText.trim()))
                 .filter(cells => cells.length === 2)"""
        )
        image = page.shot("4-training-metrics")
        shown = {name: float(value) for name, value in table["rows"]}
        # The table is drawn: its text, dark on light, inside its box.
        assert dark_pixels(image, table) > 500, table
        (summary_key,) = [
            k for k in train_output_keys(s3_server, run_id) if k.endswith("/model/summary.json")
        ]
        summary = json.loads(s3_server.read(KFP_BUCKET, summary_key))
        for name, value in summary["metrics"].items():
            assert shown[name] == pytest.approx(value, rel=1e-5), (name, shown)

        # evaluate's confusion matrix: each cell's count and, in the screenshot, its colour.
        (classification,) = [a for a in artifacts if a["type"] == "system.ClassificationMetrics"]
        open_visualization(page, "classification")
        cells = page.wait(
            """(() => [...document.querySelectorAll('td[style*=background]')].map(c => {
                 const r = c.getBoundingClientRect();
                 return {count: Number(c.innerText), color: getComputedStyle(c).backgroundColor,
                         x: r.x, y: r.y, width: r.width, height: r.height}; }))()""",
            what="the confusion matrix",
        )
        matrix = classification["metadata"]["confusionMatrix"]["struct"]
        counts = sorted(int(v) for row in matrix["rows"] for v in row["row"])
        assert sorted(c["count"] for c in cells) == counts, cells
        browser.evaluate(
            "[...document.querySelectorAll('td[style*=background]')][0].scrollIntoView()"
        )
        cells = browser.evaluate(
            """[...document.querySelectorAll('td[style*=background]')].map(c => {
                 const r = c.getBoundingClientRect();
                 return {count: Number(c.innerText), color: getComputedStyle(c).backgroundColor,
                         x: r.x, y: r.y, width: r.width, height: r.height}; })"""
        )
        image = page.shot("5-confusion-matrix")
        (fullest,) = [c for c in cells if c["count"] == max(counts)]
        assert fullest["color"] == "rgb(41, 121, 255)", fullest  # the full colour of the scale
        assert (
            pixels_of(image, fullest, fullest["color"])
            >= 0.5 * fullest["width"] * fullest["height"]
        ), fullest

        # evaluate's HTML report, read from the object store through the UI's server.
        open_visualization(page, "report")
        frame = page.wait(
            """(() => { const f = document.querySelector('iframe');
                 if (!f || !f.srcdoc.includes('elastic-step evaluation')) return null;
                 const r = f.getBoundingClientRect();
                 return {x: r.x, y: r.y, width: r.width, height: r.height}; })()""",
            what="the HTML report",
        )
        image = page.shot("6-report")
        region = image[
            int(frame["y"]) : int(frame["y"] + frame["height"]),
            int(frame["x"]) : int(frame["x"] + frame["width"]),
        ]
        assert region.std() > 20, "the report's frame is blank"
    finally:
        browser.close()


def _graph_index(page: Page, name: str, artifact: dict) -> int:
    """Which of the graph's nodes named ``name`` is ``artifact``: its Artifact Info names
    the upstream task."""
    count = page.browser.evaluate(
        f"[...document.querySelectorAll('.react-flow__node')]"
        f".filter(e => e.innerText.trim() === {name!r}).length"
    )
    for index in range(count):
        page.click_text(".react-flow__node", name, index)
        info = page.wait(
            "document.body.innerText.split('Upstream Task Name\\n')[1]?.split('\\n')[0]",
            what="the artifact's info",
        )
        if info == artifact["task"]:
            return index
    raise AssertionError(f"no {name} node of task {artifact['task']} in the graph")
