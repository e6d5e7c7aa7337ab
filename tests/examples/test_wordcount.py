"""The word-count example as a user runs it: a subprocess, its exit status and summary."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from examples.wordcount import batch_count
from tests.conftest import batch_word_count, batch_word_count_dir

pytestmark = [pytest.mark.timeout(120)]

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLE = os.path.join(ROOT, "examples", "wordcount.py")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    # The checkout under test comes first: a script's sys.path starts with its own directory,
    # so without this the example would import whatever abs_engine is installed.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.run([sys.executable, EXAMPLE, *args], capture_output=True, text=True, timeout=110, env=env)


def spark_noise(stderr: str) -> list[str]:
    """What Spark or PySpark printed but should not have (the JVM's incubator line excepted)."""
    words = ("WARN", "ERROR", "log4j", "log level", "setLogLevel", "Exception")
    return [line for line in stderr.splitlines()
            if any(w in line for w in words) and line != "WARNING: Using incubator modules: jdk.incubator.vector"]


@pytest.mark.slow
# (--source spark, aligned: the directory test below, one Spark start for both)
@pytest.mark.parametrize("mode,source", [("aligned", "file"), ("none", "file")])
def test_wordcount_cli_output_is_exact(small_corpus, tmp_path, mode, source):
    out = tmp_path / "counts.tsv"
    ck = tmp_path / "ck"
    p = run("--input", small_corpus, "--output", str(out), "--parallelism", "2",
            "--checkpoint-interval", "0.05", "--checkpoint-dir", str(ck), "--mode", mode, "--source", source)
    assert p.returncode == 0, p.stderr
    assert "output equals a plain batch count: YES" in p.stdout
    assert "source records" in p.stderr  # the progress line
    assert spark_noise(p.stderr) == []
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


@pytest.mark.slow
@pytest.mark.parametrize("source", ["file", pytest.param("spark", marks=pytest.mark.spark)])
def test_wordcount_missing_input_exits_nonzero_with_reason(tmp_path, source):
    p = run("--input", str(tmp_path / "missing.txt"), "--output", str(tmp_path / "o.tsv"), "--source", source)
    assert p.returncode == 1
    assert "missing.txt" in p.stderr and "does not exist" in p.stderr


def directory_input(text_dir: str, tmp_path) -> str:
    """The multi-file corpus plus files Spark skips (names starting with '_' or '.')."""
    d = tmp_path / "in"
    shutil.copytree(text_dir, d)
    (d / "_SUCCESS").write_text("")
    (d / "_notes.txt").write_text("hidden words here\n")
    (d / ".part-0.txt.crc").write_text("checksum words\n")
    return str(d)


def test_batch_check_counts_every_file_of_a_directory(text_dir, tmp_path):
    d = directory_input(text_dir, tmp_path)
    assert batch_count(d) == batch_word_count_dir(text_dir)
    assert batch_count(os.path.join(d, "part-3.txt")) == batch_word_count(os.path.join(text_dir, "part-3.txt"))


@pytest.mark.slow
@pytest.mark.spark
def test_wordcount_cli_counts_a_directory_through_spark(text_dir, tmp_path):
    """--source spark with aligned checkpoints, on a directory (files Spark skips left out).
    The embedded session starts and stops quietly: no start-up notices, warnings or errors of
    Spark's (its log4j2 profile, the gateway's own logger), only the JVM's own incubator-module
    line (docs/spark.md says why it stays)."""
    out, ck = tmp_path / "counts.tsv", tmp_path / "ck"
    p = run("--input", directory_input(text_dir, tmp_path), "--output", str(out), "--parallelism", "2",
            "--checkpoint-interval", "0.05", "--checkpoint-dir", str(ck), "--mode", "aligned", "--source", "spark")
    assert p.returncode == 0, p.stderr
    assert "output equals a plain batch count: YES" in p.stdout
    assert "source records" in p.stderr  # the progress line
    assert spark_noise(p.stderr) == []
    listing = subprocess.run([sys.executable, "-m", "abs_engine.cli", "checkpoints", "list", str(ck)],
                             capture_output=True, text=True)
    assert listing.returncode == 0 and " ok" in listing.stdout
    got = {}
    for line in out.read_text().splitlines():
        w, n = line.split("\t")
        assert w not in got
        got[w] = int(n)
    assert got == dict(batch_word_count_dir(text_dir))
