"""The package type-checks under ``mypy --strict`` (configured in pyproject.toml): the
py.typed marker promises users typed APIs, so CI holds us to it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.timeout(600)
def test_mypy_strict_reports_no_errors(mypy_cache_dir: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", mypy_cache_dir], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
