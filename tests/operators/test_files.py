"""TextFileSource (byte-range split, offset snapshots) and FileSink (two-phase commit)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from abs_engine import codec
from abs_engine.errors import InputError
from operators.base import OperatorContext
from operators.files import FileSink, SourceChangedError, TextFileSource


def ctx(name: str, index: int = 0, parallelism: int = 1, restored: bool = False, attempt: int = 0) -> OperatorContext:
    return OperatorContext(operator=name, subtask_index=index, parallelism=parallelism, attempt=attempt,
                           restored=restored)


def expected_lines(content: str) -> list[str]:
    """What a reader of 'lines without their newline' must produce: content.split('\\n'),
    without the empty string after a final newline (and none for an empty file)."""
    lines = content.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def write(path, content: str) -> str:
    with open(path, "wb") as f:  # binary: no newline translation
        f.write(content.encode("utf-8"))
    return str(path)


def read_all(src: TextFileSource, max_batches: int = 1_000_000) -> list[str]:
    out: list[str] = []
    for _ in range(max_batches):
        batch = src.read_batch()
        if batch is None:
            return out
        out.extend(batch)
    raise AssertionError("source did not end")


def read_subtasks(path: str, parallelism: int, batch_bytes: int) -> list[list[str]]:
    result = []
    for i in range(parallelism):
        src = TextFileSource(path, batch_bytes=batch_bytes)
        src.open(ctx("read", i, parallelism))
        try:
            result.append(read_all(src))
            assert src.read_batch() is None  # stays exhausted
        finally:
            src.close()
    return result


# ---- TextFileSource: splitting ---------------------------------------------------------------

line_text = st.text(
    alphabet=st.sampled_from(list("ab xyz\t\r") + ["é", "€", "𝄞", "ß"]), min_size=0, max_size=12
)
file_lines = st.lists(line_text, min_size=0, max_size=25)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=file_lines, trailing_newline=st.booleans(), parallelism=st.integers(1, 5),
       batch_bytes=st.sampled_from([1, 2, 3, 5, 8, 64, 1 << 16]))
@example(lines=[""], trailing_newline=False, parallelism=3, batch_bytes=1)  # empty file
@example(lines=["a"], trailing_newline=False, parallelism=5, batch_bytes=1)  # smaller than parallelism
@example(lines=["", "", ""], trailing_newline=True, parallelism=4, batch_bytes=1)  # only empty lines
@example(lines=["abc", "d", "", "ef"], trailing_newline=False, parallelism=2, batch_bytes=1 << 16)
@example(lines=["€€€€€€€€€€"], trailing_newline=True, parallelism=5, batch_bytes=2)  # split inside a char
def test_union_of_subtasks_is_the_file_in_order(tmp_path, lines, trailing_newline, parallelism, batch_bytes):
    content = "\n".join(lines) + ("\n" if trailing_newline else "")
    path = write(tmp_path / "in.txt", content)
    parts = read_subtasks(path, parallelism, batch_bytes)
    # Subtask ranges are ordered, so concatenating them in index order must give the file:
    # same multiset, each subtask's lines in file order, nothing lost or repeated.
    assert [line for part in parts for line in part] == expected_lines(content)


def test_specific_split_points(tmp_path):
    content = "aaaa\nbb\n\ncccccc\nd"
    path = write(tmp_path / "in.txt", content)
    assert read_subtasks(path, 1, 1 << 16) == [["aaaa", "bb", "", "cccccc", "d"]]
    # 17 bytes: ranges [0,8) [8,17); the empty line starts at byte 8, so it is subtask 1's
    assert read_subtasks(path, 2, 1 << 16) == [["aaaa", "bb"], ["", "cccccc", "d"]]
    assert read_subtasks(path, 2, 1) == [["aaaa", "bb"], ["", "cccccc", "d"]]
    # 3 subtasks: [0,5) [5,11) [11,17); "cccccc" starts at 9 (subtask 1), "d" at 16
    assert read_subtasks(path, 3, 2) == [["aaaa"], ["bb", "", "cccccc"], ["d"]]


def test_empty_file_yields_nothing(tmp_path):
    path = write(tmp_path / "empty.txt", "")
    assert read_subtasks(path, 1, 16) == [[]]
    assert read_subtasks(path, 3, 16) == [[], [], []]


def test_file_smaller_than_parallelism(tmp_path):
    path = write(tmp_path / "tiny.txt", "x\n")
    parts = read_subtasks(path, 5, 1)
    assert sorted(map(tuple, parts)) == [(), (), (), (), ("x",)]


def test_single_newline_is_one_empty_line(tmp_path):
    path = write(tmp_path / "nl.txt", "\n")
    assert read_subtasks(path, 1, 1) == [[""]]
    assert [x for p in read_subtasks(path, 3, 4) for x in p] == [""]


def test_batches_are_bounded_by_batch_bytes_unless_a_line_is_longer(tmp_path):
    lines = [f"line{i:03d}" for i in range(200)]  # 8 bytes + newline each
    path = write(tmp_path / "in.txt", "\n".join(lines) + "\n")
    src = TextFileSource(path, batch_bytes=100)
    src.open(ctx("read"))
    sizes = []
    while (b := src.read_batch()) is not None:
        sizes.append(len(b))
    src.close()
    assert sum(sizes) == 200
    assert max(sizes) <= 100 // 9 + 1
    assert len(sizes) > 1


def test_invalid_utf8_raises_input_error(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"ok\n\xff\xfe\n")
    src = TextFileSource(path)
    src.open(ctx("read"))
    with pytest.raises(InputError):
        read_all(src)
    src.close()


def test_check_missing_file(tmp_path):
    src = TextFileSource(tmp_path / "nope.txt")
    with pytest.raises(InputError) as ei:
        src.check()
    assert "nope.txt" in str(ei.value)
    with pytest.raises(InputError):
        src.open(ctx("read"))


def test_check_directory_is_not_a_file(tmp_path):
    with pytest.raises(InputError):
        TextFileSource(tmp_path).check()


def test_check_existing_file_passes(tmp_path):
    TextFileSource(write(tmp_path / "f.txt", "a\n")).check()  # must not raise


# ---- TextFileSource: snapshot / restore ------------------------------------------------------


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=file_lines, trailing_newline=st.booleans(), parallelism=st.integers(1, 5),
       batch_bytes=st.sampled_from([1, 2, 3, 7, 64]), data=st.data())
def test_restore_mid_way_resumes_exactly(tmp_path, lines, trailing_newline, parallelism, batch_bytes, data):
    content = "\n".join(lines) + ("\n" if trailing_newline else "")
    path = write(tmp_path / "in.txt", content)
    full = read_subtasks(path, parallelism, batch_bytes)
    for i in range(parallelism):
        src = TextFileSource(path, batch_bytes=batch_bytes)
        src.open(ctx("read", i, parallelism))
        before: list[str] = []
        for _ in range(data.draw(st.integers(0, 30), label=f"batches before snapshot #{i}")):
            b = src.read_batch()
            if b is None:
                break
            before.extend(b)
        state = codec.unpack(codec.pack(src.snapshot(7)))  # as it travels through a checkpoint
        for _ in range(data.draw(st.integers(0, 5), label=f"batches lost after snapshot #{i}")):
            if src.read_batch() is None:
                break
        src.close()
        # a fresh instance after a crash
        again = TextFileSource(path, batch_bytes=batch_bytes)
        again.open(ctx("read", i, parallelism, restored=True, attempt=1))
        again.restore(state)
        after = read_all(again)
        again.close()
        assert before + after == full[i]


def test_restore_rewinds_the_same_instance(tmp_path):
    path = write(tmp_path / "in.txt", "a\nb\nc\nd\n")
    src = TextFileSource(path, batch_bytes=2)
    src.open(ctx("read"))
    assert src.read_batch() == ["a"]
    state = src.snapshot(1)
    assert state["offset"] == 2
    assert read_all(src) == ["b", "c", "d"]
    src.restore(roundtrip(state))
    assert read_all(src) == ["b", "c", "d"]
    src.close()


def snapshot_after_one_batch(path: str) -> object:
    src = TextFileSource(path, batch_bytes=2)
    src.open(ctx("read"))
    assert src.read_batch() == ["0"]
    state = roundtrip(src.snapshot(1))
    src.close()
    return state


def restore_into(path: str, state: object) -> TextFileSource:
    again = TextFileSource(path, batch_bytes=2)
    again.open(ctx("read", restored=True, attempt=1))
    try:
        again.restore(state)
    except BaseException:
        again.close()
        raise
    return again


def test_restore_of_an_unchanged_file_resumes(tmp_path):
    path = write(tmp_path / "in.txt", "".join(f"{i}\n" for i in range(100)))
    state = snapshot_after_one_batch(path)
    src = restore_into(path, state)
    assert read_all(src) == [str(i) for i in range(1, 100)]
    src.close()


def appended(path: str) -> None:
    with open(path, "ab") as f:
        f.write(b"new line\n")


def rewritten_in_place_same_size_and_mtime(where: str):
    def change(path: str) -> None:
        st = os.stat(path)
        with open(path, "r+b") as f:
            f.seek(0 if where == "head" else st.st_size - 3)
            f.write(b"9" if where == "head" else b"X")
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # even a preserved mtime is caught
        assert os.stat(path).st_size == st.st_size
    return change


def truncated(path: str) -> None:
    os.truncate(path, os.path.getsize(path) // 2)


def touched(path: str) -> None:
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


@pytest.mark.parametrize("change", [appended, rewritten_in_place_same_size_and_mtime("head"),
                                    rewritten_in_place_same_size_and_mtime("tail"), truncated, touched],
                         ids=["appended", "head-rewritten", "tail-rewritten", "truncated", "touched"])
def test_restore_of_a_changed_file_is_a_fatal_error_naming_it(tmp_path, change):
    path = write(tmp_path / "in.txt", "".join(f"{i}\n" for i in range(100)))
    state = snapshot_after_one_batch(path)
    change(path)
    with pytest.raises(SourceChangedError) as ei:
        restore_into(path, state)
    assert path in str(ei.value) and "changed" in str(ei.value)
    assert ei.value.fatal is True  # workers report it as not retryable
    assert isinstance(ei.value, InputError)


# ---- FileSink ---------------------------------------------------------------------------------


def read_text(path) -> str:
    with open(path, "rb") as f:
        return f.read().decode("utf-8")


def roundtrip(state):
    """A sink's state as it comes back from a checkpoint file."""
    return codec.unpack(codec.pack(state))


def test_sink_two_phase_commit(tmp_path):
    out = tmp_path / "out.txt"
    sink = FileSink(out)
    sink.check()
    sink.open(ctx("write"))
    assert read_text(out) == ""
    assert sink.process(["a", "b"]) == []
    assert read_text(out) == ""
    sink.snapshot(1)
    assert read_text(out) == ""  # phase 1 only: staged in the checkpoint
    sink.process(["c"])
    sink.notify_checkpoint_complete(1)
    assert read_text(out) == "a\nb\n"  # only records before barrier 1
    sink.snapshot(2)
    sink.process(["d"])
    assert read_text(out) == "a\nb\n"
    sink.snapshot(3)
    sink.notify_checkpoint_complete(3)  # 2 was subsumed: 2 and 3 are published together
    assert read_text(out) == "a\nb\nc\nd\n"
    sink.notify_checkpoint_complete(3)  # a repeated notification is idempotent
    assert read_text(out) == "a\nb\nc\nd\n"
    sink.close()


def test_sink_notify_of_older_checkpoint_publishes_only_older_epochs(tmp_path):
    out = tmp_path / "out.txt"
    sink = FileSink(out)
    sink.open(ctx("write"))
    sink.process(["a"])
    sink.snapshot(1)
    sink.process(["b"])
    sink.snapshot(2)
    sink.notify_checkpoint_complete(1)
    assert read_text(out) == "a\n"
    sink.notify_checkpoint_complete(2)
    assert read_text(out) == "a\nb\n"


def test_sink_formats_records(tmp_path):
    out = tmp_path / "out.txt"
    sink = FileSink(out)
    sink.open(ctx("write"))
    sink.process(["w", ("word", 3), ["x", 1, 2.5], 42, None])
    sink.snapshot(1)
    sink.notify_checkpoint_complete(1)
    assert read_text(out) == "w\nword\t3\nx\t1\t2.5\n42\nNone\n"
    custom = FileSink(tmp_path / "custom.txt", format=lambda r: f"<{r}>")
    custom.open(ctx("write"))
    custom.process([1, 2])
    custom.snapshot(1)
    custom.notify_checkpoint_complete(1)
    assert read_text(tmp_path / "custom.txt") == "<1>\n<2>\n"


def written(tmp_path, fmt, records):  # type: ignore[no-untyped-def]
    sink = FileSink(tmp_path / f"out.{fmt}", format=fmt)
    sink.open(ctx("write"))
    sink.process(records)
    sink.snapshot(1)
    sink.notify_checkpoint_complete(1)
    return read_text(tmp_path / f"out.{fmt}")


def test_sink_named_formats_tsv_jsonl_csv(tmp_path):
    import csv
    import json

    records = [("word", 3), ("tab\tand \"quote\"", 1.5), "plain", 7, ("a,b", None)]
    assert written(tmp_path, "tsv", records[:1] + records[2:4]) == "word\t3\nplain\n7\n"
    assert [json.loads(line) for line in written(tmp_path, "jsonl", records).splitlines()] == [
        ["word", 3], ['tab\tand "quote"', 1.5], "plain", 7, ["a,b", None]]
    rows = list(csv.reader(written(tmp_path, "csv", records).splitlines()))
    assert rows == [["word", "3"], ['tab\tand "quote"', "1.5"], ["plain"], ["7"], ["a,b", ""]]


def test_sink_unknown_format_and_unwritable_record_are_named(tmp_path):
    from operators.base import RecordError

    with pytest.raises(ValueError, match="jsonl"):
        FileSink(tmp_path / "x", format="xml")
    sink = FileSink(tmp_path / "o.jsonl", format="jsonl")
    sink.open(ctx("write"))
    with pytest.raises(RecordError) as info:
        sink.process([("ok", 1), ("bytes", b"\x00")])
    assert info.value.record == ("bytes", b"\x00")


def test_sink_open_fresh_truncates_previous_output(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("stale\n")
    FileSink(out).open(ctx("write"))
    assert read_text(out) == ""


def test_sink_check_missing_parent(tmp_path):
    with pytest.raises(InputError):
        FileSink(tmp_path / "nodir" / "out.txt").check()


def run_epochs(sink: FileSink, epochs: dict[int, list[str]], complete: set[int]) -> dict[int, object]:
    """Process each epoch's records, snapshot at its barrier; notify the ids in ``complete``
    right after their snapshot. Returns the (msgpack round-tripped) state per checkpoint."""
    states = {}
    for cid in sorted(epochs):
        sink.process(epochs[cid])
        states[cid] = roundtrip(sink.snapshot(cid))
        if cid in complete:
            sink.notify_checkpoint_complete(cid)
    return states


def epochs_text(epochs: dict[int, list[str]], upto: int) -> str:
    return "".join(f"{r}\n" for cid in sorted(epochs) if cid <= upto for r in epochs[cid])


EPOCHS = {1: ["a1", "a2"], 2: ["b1"], 3: [], 4: ["d1", "d2", "d3"], 5: ["e1"]}


@pytest.mark.parametrize("complete", [set(EPOCHS), {2, 4}, {5}, set()], ids=["all", "some", "last", "none"])
@pytest.mark.parametrize("restore_from", sorted(EPOCHS))
def test_sink_restore_rolls_back_and_republishes(tmp_path, complete, restore_from):
    out = tmp_path / "out.txt"
    sink = FileSink(out)
    sink.open(ctx("write"))
    states = run_epochs(sink, EPOCHS, complete)
    sink.process(["after-last-barrier"])  # never in any checkpoint
    sink.close()
    # Crash; the job restarts from (completed) checkpoint `restore_from`.
    again = FileSink(out)
    again.open(ctx("write", restored=True, attempt=1))
    again.restore(states[restore_from])
    assert read_text(out) == epochs_text(EPOCHS, restore_from)
    # it continues with exactly-once output afterwards
    again.process(["new"])
    again.snapshot(restore_from + 10)
    assert read_text(out) == epochs_text(EPOCHS, restore_from)
    again.notify_checkpoint_complete(restore_from + 10)
    assert read_text(out) == epochs_text(EPOCHS, restore_from) + "new\n"


def test_sink_restore_drops_half_written_tail(tmp_path):
    out = tmp_path / "out.txt"
    sink = FileSink(out)
    sink.open(ctx("write"))
    states = run_epochs(sink, {1: ["a"], 2: ["b"]}, {1})
    with open(out, "ab") as f:
        f.write(b"garbage from a crash mid-publish")
    again = FileSink(out)
    again.open(ctx("write", restored=True))
    again.restore(states[2])
    assert read_text(out) == "a\nb\n"


def test_sink_restore_twice_is_idempotent(tmp_path):
    out = tmp_path / "out.txt"
    sink = FileSink(out)
    sink.open(ctx("write"))
    states = run_epochs(sink, {1: ["a"], 2: ["b"], 3: ["c"]}, {1})
    for _ in range(2):
        again = FileSink(out)
        again.open(ctx("write", restored=True))
        again.restore(states[2])
        assert read_text(out) == "a\nb\n"


def test_sink_restore_rejects_output_shorter_than_published(tmp_path):
    out = tmp_path / "out.txt"
    sink = FileSink(out)
    sink.open(ctx("write"))
    states = run_epochs(sink, {1: ["hello"], 2: ["world"]}, {1, 2})
    assert states[2]["published"] == len("hello\n")
    with open(out, "r+b") as f:
        f.truncate(3)  # changed outside the job
    again = FileSink(out)
    again.open(ctx("write", restored=True))
    with pytest.raises(InputError) as ei:
        again.restore(states[2])
    assert "shorter" in str(ei.value)
    assert read_text(out) == "hel"  # untouched


def test_sink_restore_rejects_missing_output(tmp_path):
    out = tmp_path / "out.txt"
    sink = FileSink(out)
    sink.open(ctx("write"))
    states = run_epochs(sink, {1: ["x"]}, {1})
    os.remove(out)
    again = FileSink(out)
    again.open(ctx("write", restored=True))
    with pytest.raises(InputError):
        again.restore(states[1])


def test_sink_parallelism_two_writes_part_files(tmp_path):
    out = tmp_path / "outdir"
    sinks = []
    for i in range(2):
        s = FileSink(out)
        s.open(ctx("write", i, 2))
        sinks.append(s)
    assert sorted(os.listdir(out)) == ["part-00000", "part-00001"]
    sinks[0].process(["zero"])
    sinks[1].process(["one", "uno"])
    for s in sinks:
        s.snapshot(1)
    assert read_text(out / "part-00000") == "" and read_text(out / "part-00001") == ""
    for s in sinks:
        s.notify_checkpoint_complete(1)
    assert read_text(out / "part-00000") == "zero\n"
    assert read_text(out / "part-00001") == "one\nuno\n"


def test_sink_directory_mode_at_parallelism_one(tmp_path):
    out = tmp_path / "outdir"
    s = FileSink(out, directory=True)
    s.open(ctx("write"))
    s.process(["x"])
    s.snapshot(1)
    s.notify_checkpoint_complete(1)
    assert os.listdir(out) == ["part-00000"]
    assert read_text(out / "part-00000") == "x\n"
