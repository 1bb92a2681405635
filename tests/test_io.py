"""Malformed input names its file and line; an interrupted write leaves the old file whole."""

import pytest

from centralrl.errors import DataError
from centralrl.io import atomic_directory, read_jsonl, write_jsonl


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2,\n')
    with pytest.raises(DataError, match=r"rows\.jsonl:3: malformed JSON"):
        list(read_jsonl(path))


def test_non_object_line_is_refused(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("[1, 2]\n")
    with pytest.raises(DataError, match=r"rows\.jsonl:1: expected a JSON object, got list"):
        list(read_jsonl(path))


def test_failed_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "out.jsonl"
    write_jsonl(path, [{"a": 1}])

    def rows():
        yield {"a": 2}
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        write_jsonl(path, rows())
    assert path.read_text() == '{"a":1}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]  # no temporary left behind


def test_failed_directory_write_keeps_the_previous_directory(tmp_path):
    target = tmp_path / "index"
    with atomic_directory(target) as tmp:
        (tmp / "a").write_text("old")
    with pytest.raises(RuntimeError), atomic_directory(target) as tmp:
        (tmp / "a").write_text("new")
        raise RuntimeError("interrupted")
    assert (target / "a").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]
