"""The reviewed equivalent mutants are keyed to files the suite can make: each
entry's SHA-256 is that of the file its label names (a release's own file, or
the seed derived from 0.29.0's), so no entry silently stops applying."""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict

import pytest
from seed import seed_source

from dpsim.mutate import equivalent, generate
from dpsim.targets.cache import ensure_release

pytestmark = pytest.mark.release

SEED_LABEL = "the seed: vllm 0.29.0: vllm/v1/worker/gpu/dp_utils.py + num_reqs"


def _text(label: str) -> str:
    if label == SEED_LABEL:
        return seed_source()
    named = re.fullmatch(r"vllm (\S+): vllm/(\S+)", label)
    assert named is not None, f"an entry's file names no file: {label!r}"
    return (ensure_release(named[1]) / named[2]).read_text()


def test_each_reviewed_entry_is_keyed_to_the_file_its_label_names() -> None:
    digests: dict[str, set[str]] = defaultdict(set)
    for entry in equivalent.load(equivalent.REVIEWED):
        digests[entry.file].add(entry.sha256)
    assert SEED_LABEL in digests
    for label, found in digests.items():
        expected = hashlib.sha256(_text(label).encode()).hexdigest()
        assert found == {expected}, label


def test_the_seeds_reviewed_mutants_are_mutants_of_the_derived_seed() -> None:
    ids = {mutant.id for mutant in generate(seed_source())}
    reviewed = [
        entry.id
        for entry in equivalent.load(equivalent.REVIEWED)
        if entry.file == SEED_LABEL
    ]
    assert len(reviewed) == 12
    assert set(reviewed) <= ids
