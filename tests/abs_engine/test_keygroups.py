"""Key groups (abs_engine/keygroups.py): golden groups that no interpreter, platform or hash
seed may move; ranges that partition the groups; routing and ownership that agree."""

from __future__ import annotations

import enum
import os
import subprocess
import sys
from collections import namedtuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from abs_engine.errors import KeyTypeError
from abs_engine.keygroups import key_group, key_group_range, operator_index_for_key_group, owners

KEYS = ["", "a", "w17", "hello world", "naïve", "日本語", "\U0001f600", 0, 1, -1, 2**31, -2**63, 2**64 + 1,
        10**30, b"", b"a", b"\x00\xff", (1, "a"), ("x", (2, b"y"), None), None, 1.5, -0.25]
#: Computed once and frozen: a change here moves keys between subtasks and breaks every
#: checkpoint ever written, so it must be deliberate (and come with a format version).
GOLDEN_128 = [87, 114, 84, 83, 121, 91, 24, 105, 2, 48, 93, 40, 79, 57, 19, 17, 109, 122, 126, 11, 70, 115]
GOLDEN_4096 = [3159, 2162, 4052, 2899, 249, 219, 2840, 873, 3586, 3504, 2269, 3240, 1359, 3129, 531, 1425, 749,
               762, 1022, 3083, 1606, 1523]


def test_golden_key_groups():
    assert [key_group(k, 128) for k in KEYS] == GOLDEN_128
    assert [key_group(k, 4096) for k in KEYS] == GOLDEN_4096


@pytest.mark.parametrize("seed", ["0", "1", "random"])
def test_key_groups_do_not_depend_on_the_hash_seed(seed):
    code = ("from abs_engine.keygroups import key_group; from tests.abs_engine.test_keygroups import KEYS; "
            "print([key_group(k, 128) for k in KEYS])")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=60,
                         env=dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=root))
    assert out.stdout.strip() == str(GOLDEN_128), out.stderr


def test_keys_equal_in_python_share_a_group_and_others_do_not_collide_by_type():
    class Colour(str, enum.Enum):
        RED = "red"

    class Level(enum.IntEnum):
        HIGH = 3

    Pair = namedtuple("Pair", "a b")
    assert key_group(1, 4096) == key_group(1.0, 4096) == key_group(True, 4096)  # one dict entry in Python
    assert key_group(0, 4096) == key_group(False, 4096) == key_group(-0.0, 4096)
    assert key_group((1, "a"), 4096) == key_group([1, "a"], 4096) == key_group(Pair(1, "a"), 4096)
    assert key_group(Colour.RED, 4096) == key_group("red", 4096) and key_group(Level.HIGH, 4096) == key_group(3, 4096)
    distinct = [key_group(k, 1 << 15) for k in ("1", b"1", 1, (1,), None, "None", (), "")]
    assert len(set(distinct)) == len(distinct)


@pytest.mark.parametrize("bad", [{1, 2}, {"a": 1}, object(), (1, {2})])
def test_a_key_of_another_type_is_a_typed_error_naming_it(bad):
    with pytest.raises(KeyTypeError, match=type(bad).__name__ if not isinstance(bad, tuple) else "set"):
        key_group(bad, 128)


@given(st.integers(1, 4096).flatmap(lambda m: st.tuples(st.just(m), st.integers(1, m))))
def test_ranges_partition_the_groups_in_order_and_agree_with_routing(mp):
    max_p, p = mp
    ranges = [key_group_range(max_p, p, i) for i in range(p)]
    assert [g for r in ranges for g in r] == list(range(max_p))  # each group once, contiguous, in order
    table = owners(max_p, p)
    for i, r in enumerate(ranges):
        assert all(operator_index_for_key_group(max_p, p, g) == i and table[g] == i for g in r)


@given(st.one_of(st.text(), st.integers(), st.binary(), st.tuples(st.text(), st.integers())), st.integers(1, 64))
def test_a_key_is_owned_by_exactly_the_subtask_it_is_routed_to(key, p):
    g = key_group(key, 128)
    owner = owners(128, p)[g]
    assert [i for i in range(p) if g in key_group_range(128, p, i)] == [owner]


def test_out_of_range_parallelism_is_refused():
    with pytest.raises(ValueError, match="max_parallelism"):
        key_group_range(128, 129, 0)
    with pytest.raises(ValueError, match="between 1 and 32768"):
        key_group_range(1 << 16, 2, 0)


def test_an_operator_wider_than_the_key_groups_is_refused_at_compile_time():
    from abs_engine import Dataflow
    from abs_engine.errors import GraphError, GraphErrorReason
    from abs_engine.testing import TestingSource
    from operators import FileSink

    flow = Dataflow("wide", parallelism=1, max_parallelism=4)
    flow.source(TestingSource([1])).key_by().count(name="count", parallelism=5).sink(FileSink("/tmp/never"))
    with pytest.raises(GraphError) as info:
        flow.compile()
    assert info.value.reason is GraphErrorReason.BAD_PARALLELISM and info.value.operator == "count"
    with pytest.raises(GraphError, match="max_parallelism"):
        Dataflow("bad", max_parallelism=0)
