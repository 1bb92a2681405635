"""Malformed input names its file and line; an interrupted write leaves the old file whole; a killed process's
scratch folder is removed by the next."""

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from centralrl.errors import DataError, OutputError
from centralrl.io import atomic_directory, atomic_write, read_json, read_jsonl, scratch_folder, write_jsonl


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2,\n')
    with pytest.raises(DataError, match=r"rows\.jsonl:3: malformed JSON"):
        list(read_jsonl(path))


def test_an_unterminated_string_is_said_once_with_its_column(tmp_path):
    """json's message ends in "starting at", to which the column was added: "starting at at column 7"."""
    (tmp_path / "rows.jsonl").write_text('{"a": 1}\n{"a": "b')
    (tmp_path / "whole.json").write_text('{"a": "b')
    for read, name in ((lambda p: list(read_jsonl(p)), "rows.jsonl:2"), (read_json, "whole.json:1")):
        with pytest.raises(DataError) as error:
            read(tmp_path / name.partition(":")[0])
        assert str(error.value).endswith(f"{name}: malformed JSON (Unterminated string starting at column 7)")


def test_non_object_line_is_refused(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("[1, 2]\n")
    with pytest.raises(DataError, match=r"rows\.jsonl:1: expected a JSON object, got list"):
        list(read_jsonl(path))


@pytest.mark.parametrize("text", ['{"id": "q1", "question": "a?", "id": "q2"}', '{"m": {"k": 1, "k": 2}}'])
def test_a_key_given_twice_is_refused_naming_it(tmp_path, text):
    """json.loads keeps the last of two equal keys without a word: a row whose id is both q1 and q2 would
    have been read as q2. At any depth; in a whole JSON file too."""
    rows, whole = tmp_path / "rows.jsonl", tmp_path / "whole.json"
    rows.write_text('{"id": "q0"}\n' + text + "\n")
    whole.write_text(text)
    key = "id" if "q2" in text else "k"
    with pytest.raises(DataError, match=rf"rows\.jsonl:2: key '{key}' appears twice in one object"):
        list(read_jsonl(rows))
    with pytest.raises(DataError, match=rf"whole\.json: key '{key}' appears twice in one object"):
        read_json(whole)


def test_what_stands_in_an_outputs_way_is_named_and_no_temporary_is_left(tmp_path):
    """A file where an output folder (or a folder above an output) should be said "<temporary>: Is a directory"
    and left an empty temporary folder behind."""
    (tmp_path / "blocker").write_text("a file")
    (tmp_path / "folder").mkdir()
    cases = [
        (lambda: atomic_directory(tmp_path / "blocker"), r"blocker: this output is a folder, but a file of that"),
        (lambda: atomic_directory(tmp_path / "blocker" / "x"), r"blocker/x: cannot be written: .*blocker is a file"),
        (lambda: atomic_write(tmp_path / "folder"), r"folder: this output is a file, but a folder of that name"),
    ]
    for opened, says in cases:
        with pytest.raises(OutputError, match=says), opened():
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker", "folder"]
    assert (tmp_path / "blocker").read_text() == "a file" and not list((tmp_path / "folder").iterdir())


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


def test_a_scratch_folder_left_by_a_killed_process_is_removed_by_the_next(tmp_path, monkeypatch):
    """What a SIGKILLed stage leaves (its Prefect server's logs) goes with the next stage's; a live one stays."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    killed = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from centralrl.io import scratch_folder; print(scratch_folder('logs'), flush=True)"
            "; import time; time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"TMPDIR": str(tmp_path)},
    )
    left = Path(killed.stdout.readline().strip())
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    (left / "server.log").write_text("the killed stage's server log\n")
    mine = scratch_folder("logs")
    assert left.parent == mine.parent == tmp_path and left.name.startswith(".logs.")
    assert not left.exists() and mine.is_dir()
    assert scratch_folder("logs").is_dir() and mine.is_dir()  # a live process's folder is kept


@pytest.mark.parametrize(
    ("path", "says"), [("/dev/null", "not a regular file"), ("{tmp}", "a folder, not a file"), ("{tmp}/x", "no such")]
)
def test_a_path_that_is_no_file_is_named_for_what_it_is(tmp_path, path, says):
    """/dev/null, read as records, was said to be missing ("no such file")."""
    from centralrl.errors import DataError
    from centralrl.io import require_file

    with pytest.raises(DataError, match=f"{path.format(tmp=tmp_path)}: {says}"):
        require_file(path.format(tmp=tmp_path))
