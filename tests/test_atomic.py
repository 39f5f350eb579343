"""Atomic artifact writes: a failing writer leaves the previous artifact and no temporary file behind."""

from __future__ import annotations

import pytest

from lightning_unlearn.atomic import write_directory_atomically, write_file_atomically, write_text_atomically


def test_text_write_replaces_and_creates_parents(tmp_path):
    target = tmp_path / "a" / "b.json"
    write_text_atomically(target, "one")
    write_text_atomically(target, "two ✓")
    assert target.read_text(encoding="utf-8") == "two ✓"
    assert sorted(p.name for p in target.parent.iterdir()) == ["b.json"]


def test_failed_file_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "rows.jsonl"
    target.write_text("old")

    def write(tmp):
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_file_atomically(target, write)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["rows.jsonl"]


def test_file_write_keeps_the_suffix_for_format_sniffing_writers(tmp_path):
    seen = []
    write_file_atomically(tmp_path / "fig.png", lambda tmp: (seen.append(tmp.suffix), tmp.write_bytes(b"x")), ".png")
    assert seen == [".png"] and (tmp_path / "fig.png").read_bytes() == b"x"


def test_failed_directory_write_keeps_the_old_directory(tmp_path):
    target = tmp_path / "export"
    write_directory_atomically(target, lambda tmp: (tmp / "model.safetensors").write_text("v1"))

    def write(tmp):
        (tmp / "model.safetensors").write_text("partial")
        raise ValueError("bad input")

    with pytest.raises(ValueError):
        write_directory_atomically(target, write)
    assert (target / "model.safetensors").read_text() == "v1"
    assert [p.name for p in tmp_path.iterdir()] == ["export"]


def test_artifacts_get_the_modes_of_plain_writes_not_private_temp_modes(tmp_path):
    import os

    old = os.umask(0o022)
    try:
        d = write_directory_atomically(tmp_path / "export", lambda tmp: (tmp / "w.bin").write_bytes(b"x"))
        f = write_text_atomically(tmp_path / "summary.json", "{}")
    finally:
        os.umask(old)
    assert d.stat().st_mode & 0o777 == 0o755  # mkdtemp alone would leave 0700
    assert f.stat().st_mode & 0o777 == 0o644  # mkstemp alone would leave 0600


def test_the_umask_is_read_without_changing_it(tmp_path):
    import os

    from lightning_unlearn.atomic import _umask

    old = os.umask(0o027)
    try:
        assert _umask() == 0o027
        assert os.umask(0o027) == 0o027  # still set: reading it did not reset it
        d = write_directory_atomically(tmp_path / "export", lambda tmp: (tmp / "w.bin").write_bytes(b"x"))
        f = write_text_atomically(tmp_path / "summary.json", "{}")
    finally:
        os.umask(old)
    assert d.stat().st_mode & 0o777 == 0o750
    assert f.stat().st_mode & 0o777 == 0o640
