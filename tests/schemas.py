"""Checks a file dpsim wrote against the JSON Schema dpsim publishes for it."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from dpsim.cex import schema
from dpsim.lanes.runner.case import is_runner_file


def assert_valid(path: Path | str) -> None:
    """``path`` validates against its kind's published schema."""
    data = json.loads(Path(path).read_text())
    published = (
        schema.runner_case_schema()
        if is_runner_file(data)
        else schema.counterexample_schema()
    )
    errors = jsonschema.Draft202012Validator(published).iter_errors(data)
    assert [f"{list(error.path)}: {error.message}" for error in errors] == []
