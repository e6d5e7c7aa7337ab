"""The word-count example as a user runs it: a subprocess, its exit status and summary."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import batch_word_count

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "wordcount.py")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, EXAMPLE, *args], capture_output=True, text=True, timeout=110)


@pytest.mark.parametrize("mode,source", [("aligned", "file"), ("none", "file"),
                                         pytest.param("aligned", "spark", marks=pytest.mark.spark)])
def test_wordcount_cli_output_is_exact(small_corpus, tmp_path, mode, source):
    out = tmp_path / "counts.tsv"
    ck = tmp_path / "ck"
    p = run("--input", small_corpus, "--output", str(out), "--parallelism", "2",
            "--checkpoint-interval", "0.05", "--checkpoint-dir", str(ck), "--mode", mode, "--source", source)
    assert p.returncode == 0, p.stderr
    assert "output equals a plain batch count: YES" in p.stdout
    assert "source records" in p.stderr  # the progress line
    got = {}
    for line in out.read_text().splitlines():
        w, n = line.split("\t")
        assert w not in got
        got[w] = int(n)
    assert got == dict(batch_word_count(small_corpus))
    if mode == "aligned":
        listing = subprocess.run([sys.executable, "-m", "abs_engine.cli", "checkpoints", "list", str(ck)],
                                 capture_output=True, text=True)
        assert listing.returncode == 0 and " ok" in listing.stdout


@pytest.mark.parametrize("source", ["file", pytest.param("spark", marks=pytest.mark.spark)])
def test_wordcount_missing_input_exits_nonzero_with_reason(tmp_path, source):
    p = run("--input", str(tmp_path / "missing.txt"), "--output", str(tmp_path / "o.tsv"), "--source", source)
    assert p.returncode == 1
    assert "missing.txt" in p.stderr and "does not exist" in p.stderr
