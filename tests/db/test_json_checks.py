"""The store's check of free-form JSON fields (kvsplit.db.checks.check_json_tree, used by every writer, the
import and the plan service's nesting limit) and the import's file reader."""

from __future__ import annotations

import json
import math

import orjson
import pytest

from kvsplit.db.checks import MAX_JSON_DEPTH, check_json_tree, field_json_obj
from kvsplit.db.transfer import MAX_IMPORT_FIELD_BYTES, ImportValidationError, parse_export


def lists(n: int) -> object:
    v: object = 1
    for _ in range(n):
        v = [v]
    return v


def test_depth_limit_counts_the_field_itself_and_is_exact():
    check_json_tree("f", {"a": lists(MAX_JSON_DEPTH - 1)})  # the object + 31 arrays = 32 levels
    with pytest.raises(ValueError, match=r"^f\.a(\[0\]){31}: nested deeper than 32 levels"):
        check_json_tree("f", {"a": lists(MAX_JSON_DEPTH)})
    check_json_tree("f", lists(3), max_depth=3)
    with pytest.raises(ValueError, match="nested deeper than 2 levels"):
        check_json_tree("f", lists(3), max_depth=2)
    # every value within the limit is one orjson writes back (its own limit is 254 levels)
    assert orjson.loads(orjson.dumps({"a": lists(MAX_JSON_DEPTH - 1)})) == {"a": lists(MAX_JSON_DEPTH - 1)}


def test_any_depth_is_checked_without_recursion():
    v = lists(200_000)  # far past Python's recursion limit
    with pytest.raises(ValueError, match="nested deeper than 32 levels"):
        check_json_tree("f", {"a": v})
    check_json_tree("f", {"a": v}, max_depth=200_002)


@pytest.mark.parametrize(
    "value,why",
    [
        ({"n": 2**63}, r"f\.n: integer outside the 64-bit range"),
        ({"n": [-(2**63) - 1]}, r"f\.n\[0\]: integer outside the 64-bit range"),
        ({"x": {"y": math.nan}}, r"f\.x\.y: expected a finite number, got nan"),
        ({"x": [1, {"y": -math.inf}]}, r"f\.x\[1\]\.y: expected a finite number"),
        ({"x": {1: 2}}, r"f\.x: keys must be strings, got 1"),
        ({"x": [object()]}, r"f\.x\[0\]: not JSON data \(object\)"),
    ],
)
def test_values_any_reader_could_not_serialise_are_refused_by_path(value, why):
    with pytest.raises(ValueError, match=why):
        check_json_tree("f", value)
    if "keys" not in why:
        check_json_tree("f", value, depth_only=True)  # the plan service's use: nesting (and keys) alone


def test_json_obj_size_limit_and_bounded_messages():
    ok = {"log": "x" * (MAX_IMPORT_FIELD_BYTES - len('{"log":""}'))}
    assert len(json.dumps(ok, separators=(",", ":"))) == MAX_IMPORT_FIELD_BYTES
    assert field_json_obj("v", ok, max_bytes=MAX_IMPORT_FIELD_BYTES) == ok
    with pytest.raises(
        ValueError,
        match=f"v: {MAX_IMPORT_FIELD_BYTES + 1} characters of JSON, more than the {MAX_IMPORT_FIELD_BYTES} accepted",
    ):
        field_json_obj("v", {"log": ok["log"] + "y"}, max_bytes=MAX_IMPORT_FIELD_BYTES)
    with pytest.raises(ValueError) as e:
        field_json_obj("v", {"k": 1.0, "": "z" * 10**6})
    assert len(str(e.value)) < 200  # a bad value is quoted in 80 characters at most


def test_parse_export_one_line_errors():
    assert parse_export(b'{"a": [1]}') == {"a": [1]}
    for raw, why in (
        (b"[" * 100_000 + b"]" * 100_000, "too deeply to read"),
        (b'{"a": \xff}', "is not JSON"),
        (b'{"a": 1', "is not JSON"),
        ("", "is not JSON"),
    ):
        with pytest.raises(ImportValidationError, match=why) as e:
            parse_export(raw, source="f.json")
        assert str(e.value).startswith("import rejected, nothing stored: f.json ") and "\n" not in str(e.value)
