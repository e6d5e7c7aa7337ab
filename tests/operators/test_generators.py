"""Progressions (the offsets of generated and testing sources): after any rescale every
unread index is read exactly once, and each subtask reads its share in increasing order
(where the index is event time, a subtask's timestamps stay ascending)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from operators.generators import Progressions


def read_all(p: Progressions, batch: int) -> list[int]:
    out: list[int] = []
    while (r := p.take(batch)) is not None:
        assert len(r) <= batch
        out.extend(r)
    return out


@settings(max_examples=200, deadline=None)
@given(stop=st.integers(0, 300), old_p=st.integers(1, 5), new_p=st.integers(1, 5), again_p=st.integers(1, 4),
       reads=st.lists(st.integers(0, 40), min_size=5, max_size=5), batch=st.integers(1, 17))
def test_rescaled_shares_cover_the_unread_indices_once_each_in_increasing_order(stop, old_p, new_p, again_p,
                                                                                   reads, batch):
    old = [Progressions.of_subtask(stop, k, old_p) for k in range(old_p)]
    seen = [i for k, p in enumerate(old) for _ in range(reads[k]) for i in (p.take(batch) or [])]
    new = [Progressions(stop, Progressions.rescale(stop, [p.state() for p in old], old_p, i, new_p))
           for i in range(new_p)]
    # read some more, then rescale once again (a share of several progressions rescales too)
    seen += [i for k, p in enumerate(new) for _ in range(reads[k] // 2) for i in (p.take(batch) or [])]
    final = [Progressions(stop, Progressions.rescale(stop, [p.state() for p in new], new_p, i, again_p))
             for i in range(again_p)]
    shares = [read_all(p, batch) for p in final]
    for share in shares:
        assert share == sorted(set(share))  # strictly increasing
    assert sorted(seen + [i for s in shares for i in s]) == list(range(stop))
