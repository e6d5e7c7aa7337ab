"""Which directories a job may checkpoint into (checkpoint/directory.py): each refusal is a
typed CheckpointError naming the fix, raised before anything is written; what is accepted
is made private (0700)."""

from __future__ import annotations

import os
import subprocess

import pytest

from abs_engine.checkpoint.directory import prepare
from abs_engine.errors import CheckpointError, CheckpointErrorReason

BAD = CheckpointErrorReason.BAD_DIRECTORY


def refused(path: str, reason: CheckpointErrorReason = BAD) -> str:
    with pytest.raises(CheckpointError) as e:
        prepare(path)
    assert e.value.reason is reason
    return str(e.value)


def test_system_and_home_directories_are_refused_even_empty(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert "system or home directory" in refused("/")
    refused("/tmp")
    refused(os.path.expanduser("~"))
    refused(str(tmp_path / ".." / ".." / ".."))  # the same, written another way: resolved first
    assert not os.path.exists("/_lock") and not os.path.exists("/chk-000001")


def test_a_file_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "ckpt"
    f.write_text("data")
    assert "not a directory" in refused(str(f))
    assert f.read_text() == "data"


def test_a_directory_of_other_files_is_refused_and_untouched(tmp_path) -> None:  # type: ignore[no-untyped-def]
    d = tmp_path / "project"
    d.mkdir(mode=0o755)
    (d / "notes.txt").write_text("mine")
    assert "'notes.txt'" in refused(str(d))
    assert os.stat(d).st_mode & 0o777 == 0o755  # not narrowed: it is not ours


def test_a_directory_others_can_write_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    assert "chmod 700" in refused(str(d))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_another_users_directory_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    assert "another user" in refused(str(d))


def test_what_is_accepted_is_made_private(tmp_path) -> None:  # type: ignore[no-untyped-def]
    new = prepare(str(tmp_path / "a" / "new"))
    assert os.stat(new).st_mode & 0o777 == 0o700
    old = tmp_path / "existing"
    old.mkdir(mode=0o755)
    for name in ("chk-000003", "savepoints"):
        (old / name).mkdir()
    for name in ("_lock", "_fence", "_job_stats.json", "report.html"):
        (old / name).write_text("")
    assert prepare(str(old)) == str(old) and os.stat(old).st_mode & 0o777 == 0o700


def test_resume_into_a_missing_directory_is_not_a_fresh_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CheckpointError) as e:
        prepare(str(tmp_path / "typo"), must_exist=True)
    assert e.value.reason is CheckpointErrorReason.NOT_FOUND and "resume='if-present'" in str(e.value)
    assert not (tmp_path / "typo").exists()


@pytest.fixture
def read_only(tmp_path):  # type: ignore[no-untyped-def]
    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m,mode=0700", "none", str(d)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root and mount(8) to make a read-only file system")
    yield d
    subprocess.run(["umount", str(d)], check=True)


def test_a_read_only_file_system_is_refused_at_once(read_only) -> None:  # type: ignore[no-untyped-def]
    assert "read-only file system" in refused(str(read_only))
    assert "read-only file system" in refused(str(read_only / "sub"))
