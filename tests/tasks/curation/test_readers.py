"""Reading files: line numbers survive, bad lines are reported, unreadable files fail with one clear line."""

import json

import polars as pl
import pytest

from tasks.curation.readers import SourceReadError, read_rows


def test_jsonl_rows_keep_their_line_numbers(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"a": 1}\n\nnot json\n[1, 2]\n{"a": 2}\n')
    rows = list(read_rows(str(path)))
    assert [(r.line, r.record) for r in rows] == [(1, {"a": 1}), (3, None), (4, None), (5, {"a": 2})]
    assert rows[1].error.startswith("invalid JSON") and rows[1].raw == "not json\n"
    assert "not an object" in rows[2].error


def test_limit_counts_valid_rows(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(10)))
    assert [r.record["i"] for r in read_rows(str(path), limit=3)] == [0, 1, 2]


def test_parquet_rows_are_numbered_from_one(tmp_path):
    path = tmp_path / "data.parquet"
    pl.DataFrame({"question": ["a", "b"]}).write_parquet(path)
    assert [(r.line, r.record) for r in read_rows(str(path))] == [(1, {"question": "a"}), (2, {"question": "b"})]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: None, "No such file"),
        (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4), "no line is a JSON object"),
    ],
)
def test_unreadable_jsonl_fails_naming_the_file(tmp_path, make, message):
    path = tmp_path / "broken.jsonl"
    make(path)
    with pytest.raises(SourceReadError, match=message) as error:
        list(read_rows(str(path)))
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_unreadable_parquet_fails_naming_the_file(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_text("this is not parquet")
    with pytest.raises(SourceReadError, match="not a readable Parquet file") as error:
        list(read_rows(str(path)))
    assert str(path) in str(error.value)


def test_a_byte_order_mark_is_tolerated(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"a": 1}\n')
    from tasks.curation.readers import probe

    probe(str(path))
    assert [r.record for r in read_rows(str(path))] == [{"a": 1}]


def test_an_empty_file_is_an_error(tmp_path):
    from tasks.curation.readers import probe

    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(SourceReadError, match="holds no rows"):
        probe(str(path))
    with pytest.raises(SourceReadError, match="holds no rows"):
        list(read_rows(str(path)))
