"""A restore spec travels in a Deploy as data and comes back as the same typed value;
anything else is refused as a malformed message, naming the field."""

from __future__ import annotations

import pytest

from abs_engine import codec
from abs_engine.checkpoint.incremental import ChainRef
from abs_engine.checkpoint.metadata import FileRef
from abs_engine.checkpoint.restore_spec import Inflight, Rescale, SamePlan, from_data, to_data
from abs_engine.errors import ProtocolError, ProtocolErrorReason

SAME = SamePlan(7, "/ck", FileRef("count#0.state", 120, "ab" * 32), (ChainRef(5, "count#0.state", 99, "cd" * 32),))
RESCALE = Rescale(
    7, "/ck",
    files={"count#0": FileRef("count#0.state", 120, "ab" * 32), "count#1": FileRef("count#1.state", 80, "ef" * 32)},
    chains={"count#1": (ChainRef(6, "count#1.state", 70, "12" * 32),)},
    operators={"count": ("count#0", "count#1"), "sink": ("count#0",)},
    changed=frozenset({"count"}),
    inflight=(Inflight("count", ("count#0", "count#1"), True, True),),
    max_parallelism=128,
)


@pytest.mark.parametrize("spec", [SAME, RESCALE], ids=["same-plan", "rescale"])
def test_a_spec_comes_back_as_it_was_sent_through_msgpack(spec: object) -> None:
    data = codec.unpack(codec.pack(to_data(spec)))  # type: ignore[arg-type]
    assert from_data(data) == spec


@pytest.mark.parametrize("mangle, names", [
    (lambda d: d.pop("kind"), "kind"),
    (lambda d: d.update(kind="other"), "other"),
    (lambda d: d.update(checkpoint_id="7"), "checkpoint_id"),
    (lambda d: d.update(checkpoint_id=True), "checkpoint_id"),
    (lambda d: d.update(file=["f", "120", "ab"]), "integer"),
    (lambda d: d.update(chain=[[5, "f", 99]]), "unpack"),
])
def test_a_mangled_spec_is_a_malformed_message(mangle, names: str) -> None:  # type: ignore[no-untyped-def]
    data = to_data(SAME)
    mangle(data)
    with pytest.raises(ProtocolError) as e:
        from_data(data)
    assert e.value.reason is ProtocolErrorReason.MALFORMED and names in str(e.value)


def test_a_mangled_rescale_names_what_is_wrong() -> None:
    data = to_data(RESCALE)
    data["inflight"] = [["count", "count#0", True, True]]  # sources must be an array
    with pytest.raises(ProtocolError, match="not an array"):
        from_data(data)
    with pytest.raises(ProtocolError, match="not a map"):
        from_data(["same"])
