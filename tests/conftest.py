"""Shared fixtures. Tests are a package (tests/__init__.py) so that functions defined in
test modules can be shipped to worker processes by reference (they import them)."""

from __future__ import annotations

import collections
import os

import pytest

from abs_engine.testing import write_zipf_corpus


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="session")
def small_corpus(corpus_dir: str) -> str:
    """200k words, 2k-word vocabulary."""
    return write_zipf_corpus(os.path.join(corpus_dir, "small.txt"), 200_000, vocabulary=2_000, seed=1)


@pytest.fixture(scope="session")
def medium_corpus(corpus_dir: str) -> str:
    """2M words, 10k-word vocabulary: long enough (about a second) to kill workers mid-run."""
    return write_zipf_corpus(os.path.join(corpus_dir, "medium.txt"), 2_000_000, vocabulary=10_000, seed=2)


def batch_word_count(path: str) -> collections.Counter[str]:
    """The exact oracle for word count: a plain single-process batch computation."""
    c: collections.Counter[str] = collections.Counter()
    with open(path, encoding="utf-8") as f:
        for line in f:
            c.update(line.split())
    return c
