"""The public API is generic (``Stream[T]``, ``KeyedStream[T, K]``): mypy infers the record
types a pipeline's streams carry and rejects a function that does not fit them. Checked by
running mypy --strict on a small pipeline and reading its revealed types."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PIPELINE = '''from abs_engine import Dataflow, Feedback
from abs_engine.testing import TestingSource
from operators import RangeSource, TextFileSource


def zero() -> int:
    return 0


def add(acc: int, word: str) -> int:
    return acc + len(word)


def both(a: int, b: int) -> int:
    return a + b


def half(acc: int) -> float:
    return acc / 2


flow = Dataflow()
words = flow.source(TextFileSource("in.txt")).flat_map(str.split)
reveal_type(words)  # words
reveal_type(words.key_by().count_final())  # counts
reveal_type(words.key_by(len).count())  # counts by length
reveal_type(words.key_by(len).aggregate(zero, add, half))  # aggregate with result
reveal_type(words.key_by(len).aggregate_final(zero, add, merge=both))  # merged
reveal_type(words.key_by(len).fold_final(lambda: 0, lambda a, w: a + len(w)))  # fold
reveal_type(words.key_by(len).stateful_map(lambda s, w: ((s or 0) + 1, w.upper())))  # stateful map
reveal_type(flow.source(TestingSource([1.5, 2.5])).filter(lambda x: x > 2).key_by().reduce(max))  # reduce
nums = flow.source(RangeSource(10)).map(lambda n: n * 2)
reveal_type(nums.union(nums).rebalance())  # union
loop: Feedback[int] = flow.feedback()
loop.connect(nums)
nums.map(str.upper)  # wrong type
loop.connect(words)  # wrong loop
'''

EXPECTED = {
    "words": "Stream[str]",
    "counts": "Stream[tuple[str, int]]",
    "counts by length": "Stream[tuple[int, int]]",
    "aggregate with result": "Stream[tuple[int, float]]",
    "merged": "Stream[tuple[int, int]]",
    "fold": "Stream[tuple[int, int]]",
    "stateful map": "Stream[tuple[int, str]]",
    "reduce": "Stream[tuple[float, float]]",
    "union": "Stream[int]",
}


@pytest.mark.timeout(600)
def test_mypy_infers_record_types_and_rejects_functions_that_do_not_fit(tmp_path: object, mypy_cache_dir: str) -> None:
    path = os.path.join(str(tmp_path), "pipeline.py")
    with open(path, "w") as f:
        f.write(PIPELINE)
    lines = PIPELINE.splitlines()
    proc = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--cache-dir", mypy_cache_dir, path], cwd=ROOT,
                          capture_output=True, text=True)
    out = proc.stdout
    revealed, errors = {}, {}
    for m in re.finditer(r"pipeline\.py:(\d+): (note|error): (.*)", out):
        comment = lines[int(m.group(1)) - 1].split("# ")[-1]
        if m.group(2) == "note" and m.group(3).startswith("Revealed type is"):
            revealed[comment] = re.sub(r"abs_engine\.\w+\.", "", m.group(3).split('"')[1])
        elif m.group(2) == "error":
            errors[comment] = m.group(3)
    assert revealed == EXPECTED, out
    assert set(errors) == {"wrong type", "wrong loop"}, out
    assert 'expected "Callable[[int], str]"' in errors["wrong type"], out
