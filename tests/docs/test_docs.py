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
    for module, classes in (("abs_engine.executors.config", (JobResult,)),
                            ("abs_engine.monitor.model", (CheckpointStat, SubtaskStat, RecoveryEvent))):
        attr_docs = ModuleAnalyzer.for_module(module).find_attr_docs()
        for cls in classes:
            undocumented = [f.name for f in dataclasses.fields(cls) if (cls.__name__, f.name) not in attr_docs]
            assert not undocumented, f"{cls.__name__} fields without a #: comment: {undocumented}"


def test_the_readme_links_the_reference_and_the_tutorial() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in ("docs/tutorial.md", "docs/api.md"):
        assert f"]({page})" in readme and (ROOT / page).exists(), page
