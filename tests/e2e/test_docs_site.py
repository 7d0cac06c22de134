"""The documentation site as its reader sees it: built by `make docs`'s command (warnings as
errors), served over HTTP on loopback and opened in headless Chromium. Its reference pages
list every flag of the CLI's parser and every parameter of each component, on both engines,
with nothing loaded from elsewhere; a broken link fails the build.
"""

from __future__ import annotations

import functools
import http.server
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from headless_chromium import HeadlessChromium

from elastic_step import __version__
from elastic_step.cli import command_parser
from elastic_step.components import parameters
from elastic_step.master.reporting import report_fields
from elastic_step.master.reporting.metrics_endpoint import METRICS

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
MKDOCS = [sys.executable, "-m", "mkdocs", "build", "--strict"]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*MKDOCS, "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("docs") / "site"
    built = _build(REPO / "mkdocs.yml", site)
    assert built.returncode == 0, built.stderr
    assert "WARNING" not in built.stderr, built.stderr
    return site


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def served(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(timeout=10)


def _nav_pages() -> dict[str, Path]:
    """Every page in the site's navigation: its URL path, and its Markdown file."""

    def files(entries) -> list[str]:
        found = []
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            found += files(value) if isinstance(value, list) else [value]
        return found

    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"]
    return {
        ("/" + name.removesuffix(".md").removesuffix("index") + "/").replace("//", "/"): REPO
        / "docs"
        / name
        for name in files(nav)
    }


#: The text of the tables of the page's article as rendered, by the titles of their h2 and
#: h3 (a usage line names flags too: only a table row says what one does).
SECTIONS_JS = """(() => {
  const sections = {};
  const title = (element) => element.innerText.replace("\u00b6", "").trim();
  let h2 = null, h3 = "";
  for (const element of document.querySelector("article").children) {
    if (element.tagName === "H2") {
      h2 = title(element);
      h3 = "";
      sections[h2] = {};
    } else if (element.tagName === "H3" && h2 !== null) {
      h3 = title(element);
    } else if (h2 !== null) {
      const tables = element.matches("table") ? [element] : element.querySelectorAll("table");
      for (const table of tables) {
        sections[h2][h3] = (sections[h2][h3] || "") + table.innerText + "\\n";
      }
    }
  }
  return sections;
})()"""


@pytest.fixture(scope="module")
def pages(served, tmp_path_factory) -> dict:
    """Each page as Chromium renders it, by path: its whole text and its sections' texts;
    and what the browser saw go wrong, and what it fetched from elsewhere."""
    browser = HeadlessChromium(tmp_path_factory.mktemp("profile"), width=1280, height=900)
    try:
        pages: dict = {}
        for path in _nav_pages():
            browser.load(served + path)
            pages[path] = browser.evaluate("document.body.innerText")
            pages[path + "#sections"] = browser.evaluate(SECTIONS_JS)
            pages[path + "#title"] = browser.evaluate(
                'document.querySelector("article h1").innerText.replace("\\u00b6", "").trim()'
            )
        pages["errors"] = "\n".join(browser.errors())
        pages["elsewhere"] = "\n".join(
            url
            for url in browser.requests()
            if not url.startswith((served, "data:"))  # data: is in the page itself
        )
    finally:
        browser.close()
    return pages


def test_every_page_loads_with_nothing_from_elsewhere_and_the_version_is_named(pages):
    # The guides, the reference and the design: each page shows its own title.
    assert len(_nav_pages()) >= 15, list(_nav_pages())
    for path, source in _nav_pages().items():
        title = source.read_text().split("\n", 1)[0].removeprefix("# ")
        assert pages[path + "#title"] == title, path
    assert pages["errors"] == ""
    assert pages["elsewhere"] == ""
    assert f"This site documents elastic-step {__version__}." in pages["/"]
    assert f"elastic-step {__version__}" in pages["/reference/cli/"]  # each page's footer
    assert "elastic-step preprocess --input data.csv" in pages["/getting-started/"]


@pytest.mark.parametrize("command", ["preprocess", "train", "evaluate", "predict"])
def test_the_cli_reference_lists_every_flag_of_the_parser(pages, command):
    page = pages["/reference/cli/"]
    section = "".join(pages["/reference/cli/#sections"][f"elastic-step {command}"].values())
    for action in command_parser(command)._actions:
        for option in action.option_strings:
            assert option in section, f"{option} of {command} is not on the page"
    assert "--version" in page and "print the version and exit" in page


def test_the_components_reference_lists_every_parameter_on_both_engines(pages):
    sections = pages["/reference/components/#sections"]
    template = yaml.safe_load((REPO / "components/argo/workflow-template.yaml").read_text())
    argo = {t["name"]: t for t in template["spec"]["templates"]}
    for name, command in parameters.COMMANDS.items():
        section = "".join(sections[name].values())
        kfp_part, argo_part = (
            sections[name]["On Kubeflow Pipelines"],
            sections[name]["On Argo Workflows"],
        )
        kfp = yaml.safe_load(
            (REPO / "components/kfp" / f"{name.replace('-', '_')}.yaml").read_text()
        )
        for parameter in kfp["root"]["inputDefinitions"]["parameters"]:
            assert parameter in kfp_part, f"{parameter} of {name} (KFP)"
        for parameter in argo[name]["inputs"]["parameters"]:
            assert parameter["name"] in argo_part, f"{parameter['name']} of {name} (Argo)"
        # Each flag is a parameter of each engine's component, or the page says why not.
        for flag in parameters.command_flags(command).values():
            for engine in parameters.ENGINES:
                deviation = parameters.deviation(command, flag.option, engine)
                if isinstance(deviation, parameters.LeftOut):
                    assert flag.option in section and deviation.why in section, flag.option
                else:
                    part = kfp_part if engine == parameters.KFP else argo_part
                    assert parameters.parameter_name(command, flag, engine) in part


def test_a_broken_link_fails_the_build(tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(REPO / "docs", copy / "docs")
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    page = copy / "docs" / "getting-started.md"
    page.write_text(page.read_text() + "\nSee [the guide](guides/missing.md).\n")
    built = _build(copy / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0
    assert "guides/missing.md" in built.stderr, built.stderr


def test_the_metrics_reference_lists_every_metric_with_its_labels(pages):
    rows = pages["/reference/metrics/"].splitlines()  # a table row is a line, tab-separated
    for spec in METRICS.values():
        row = next((line for line in rows if line.startswith(spec.exposed + "\t")), "")
        assert row, f"{spec.exposed} is not on the page"
        assert all(label in row for label in spec.labels) and spec.help in row, row


def test_the_reports_reference_lists_every_field_by_kind_of_job(pages):
    sections = pages["/reference/status-and-summary/#sections"]
    for document, fields in (
        ("status.json", report_fields.STATUS),
        ("summary.json", report_fields.SUMMARY),
    ):
        for kind, described in fields.items():
            rows = sections[document][f"Of elastic-step {kind}"].splitlines()
            listed = {row.split("\t", 1)[0] for row in rows[1:]}
            assert listed == set(described), (document, kind)


def test_the_readme_stays_short_and_its_links_lead_to_pages() -> None:
    """The README says what the project is and links to the site's pages, which hold the
    rest (issue 36: under 250 lines)."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 250
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(links) >= 15, links  # getting started, the guides, design, development
    for link in links:
        assert (REPO / link).is_file(), link
