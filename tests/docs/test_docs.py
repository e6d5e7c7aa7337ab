"""The documentation (docs/): the API reference and tutorial build with Sphinx with warnings
as errors, every code block of the tutorial runs and prints what the page shows (its
pipelines include a worker SIGKILLed mid-run and a Spark source), and every job option and
result field is documented where the reference reads it."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from abs_engine.executors.config import JobConfig, JobResult
from abs_engine.monitor.model import CheckpointStat, RecoveryEvent, SubtaskStat

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RUNNER = Path(__file__).with_name("markdown_blocks.py")


def run_page(page: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(RUNNER), str(page)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.timeout(600)
def test_the_reference_and_tutorial_build_with_warnings_as_errors(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q", "-b", "html",
                           str(DOCS), str(tmp_path / "html")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    api = (tmp_path / "html" / "api.html").read_text()
    for documented in ("aggregate_final", "stateful_map", "KeyedProcess", "TestingSource", "JobConfig",
                       "checkpoint_interval", "SparkSource"):
        assert documented in api, documented
    assert (tmp_path / "html" / "tutorial.html").exists()


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(600)
def test_every_tutorial_block_runs_and_prints_what_the_page_shows(tmp_path: Path) -> None:
    proc = run_page(DOCS / "tutorial.md", tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ran = [line for line in proc.stderr.splitlines() if line.endswith(": ok")]
    assert len(ran) == proc.stderr.count(": ok") >= 9, proc.stderr[-4000:]


def test_the_block_runner_fails_on_another_output_and_on_an_exception(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n```python\nx = 2\nprint(x, 'items')\n```\n\n```text\n2 ...\n```\n\n"
                    "```python\nprint(x + 1)\n```\n\n```text\n4\n```\n")
    proc = run_page(page, tmp_path)
    assert proc.returncode == 1 and "page.md:12: the block printed\n3" in proc.stderr, proc.stderr
    assert "page.md:3: ok" in proc.stderr  # "..." matched " items"
    page.write_text("```python\nraise ValueError('broken example')\n```\n")
    proc = run_page(page, tmp_path)
    assert proc.returncode == 1 and "the block raised" in proc.stderr and "broken example" in proc.stderr
    page.write_text("```bash\necho no python here\n```\n")
    assert run_page(page, tmp_path).returncode == 1  # a page that tests nothing is an error


def test_every_job_option_and_result_field_is_documented() -> None:
    from sphinx.pycode import ModuleAnalyzer

    doc = JobConfig.__doc__ or ""
    missing = [f.name for f in dataclasses.fields(JobConfig) if f"``{f.name}``" not in doc]
    assert not missing, f"JobConfig options without an entry in its docstring: {missing}"
    for module, classes in (("abs_engine.executors.result", (JobResult,)),
                            ("abs_engine.monitor.model", (CheckpointStat, SubtaskStat, RecoveryEvent))):
        attr_docs = ModuleAnalyzer.for_module(module).find_attr_docs()
        for cls in classes:
            undocumented = [f.name for f in dataclasses.fields(cls) if (cls.__name__, f.name) not in attr_docs]
            assert not undocumented, f"{cls.__name__} fields without a #: comment: {undocumented}"


def test_the_readme_links_the_reference_and_the_tutorial() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in ("docs/tutorial.md", "docs/api.md"):
        assert f"]({page})" in readme and (ROOT / page).exists(), page


def toctree_pages() -> list[str]:
    """The pages of docs/index.md's toctree, in order (``tutorial``, ``api``, ...)."""
    index = (DOCS / "index.md").read_text()
    body = index.split("```{toctree}", 1)[1].split("```", 1)[0]
    return [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith(":")]


def test_the_readme_is_a_front_page_that_links_every_guide() -> None:
    readme = (ROOT / "README.md").read_text()
    lines = readme.count("\n") + (not readme.endswith("\n"))
    assert lines <= 250, f"README.md has {lines} lines: move the detail into a page of docs/"
    pages = toctree_pages()
    assert {"tutorial", "api", "architecture"} <= set(pages), pages
    for page in pages:
        assert (DOCS / f"{page}.md").exists(), page
        assert f"](docs/{page}.md" in readme, f"README.md does not link docs/{page}.md"
    # .ci/run runs the README's test command: the two must stay the same.
    command = "python3 -m pip install -e '.[dev]' && python3 -m pytest -m 'not serial' && python3 -m pytest -n 0 -m serial"
    assert command in readme and command in (ROOT / ".ci" / "run").read_text()


def test_every_page_of_docs_is_in_the_toctree() -> None:
    pages = set(toctree_pages())
    unlisted = sorted(p.stem for p in DOCS.glob("*.md") if p.stem != "index" and p.stem not in pages)
    assert not unlisted, f"pages in no toctree of docs/index.md: {unlisted}"


def test_the_architecture_layout_lists_every_module() -> None:
    """docs/architecture.md's Layout names every module of abs_engine and operators, under
    its package's heading (```### `abs_engine/runtime/` ```, then ``- `task.py`: ...``)."""
    layout = (DOCS / "architecture.md").read_text().split("\n## Layout\n", 1)[1]
    listed: set[str] = set()
    package = ""
    for line in layout.splitlines():
        if line.startswith("### `") and line.endswith("/`"):
            package = line[len("### `"):-1]
        elif line.startswith("- `") and package and line.find("`", 3) > 3:
            listed.add(package + line[3:line.find("`", 3)])
    modules = {p.relative_to(ROOT).as_posix() for pkg in ("abs_engine", "operators")
               for p in (ROOT / pkg).rglob("*.py")}
    missing = sorted(modules - listed)
    assert not missing, f"modules missing from the Layout of docs/architecture.md: {missing}"
    gone = sorted(m for m in listed - modules if m.endswith(".py"))
    assert not gone, f"the Layout of docs/architecture.md lists modules that do not exist: {gone}"
