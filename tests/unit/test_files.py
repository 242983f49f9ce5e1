"""dtppo.files: a file or directory appears whole under its final name, or the old one stays."""

import os

import pytest

from dtppo import files


def test_write_file_replaces_the_whole_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("old\n")
    files.write_file(path, "new\n")
    assert path.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    files.write_file(path, b"\x00bytes")
    assert path.read_bytes() == b"\x00bytes"


def test_a_write_that_fails_before_the_rename_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "trackers.json"
    path.write_text("old")

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError):
        files.write_file(path, "new")
    assert path.read_text() == "old"  # the negative control of a plain write_text, which would have truncated it


def test_replace_dir_puts_the_finished_directory_in_place_and_removes_the_old(tmp_path):
    final, tmp = tmp_path / "model", tmp_path / "model.tmp"
    final.mkdir()
    (final / "old.txt").write_text("old")
    tmp.mkdir()
    (tmp / "new.txt").write_text("new")
    files.replace_dir(tmp, final)
    assert [p.name for p in final.iterdir()] == ["new.txt"] and sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    files.discard_dir(final)
    assert list(tmp_path.iterdir()) == []
