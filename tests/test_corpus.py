"""The faulty-target corpus: every planted bug is caught, every twin is clean.

Each faulty target must fail its designated property under ``dpsim check``'s
default budget (seed 0), and its correct reference twin must pass the same
check; a witness must also pass every other property. That pair of facts is
what makes the corpus evidence that a property catches its bug class. The
tests are independent and parametrised, so pytest-xdist spreads them
(``pytest -n 2 tests/test_corpus.py``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import dpsim.corpus as corpus
from dpsim.check import DEFAULT_EXAMPLES, CheckOptions, run_check
from dpsim.corpus import CORPUS, CorpusError, FaultyTarget
from dpsim.properties import PROPERTIES, PROPERTY_NAMES
from dpsim.scenarios.programs import SCENARIOS
from dpsim.targets import load_target

pytestmark = pytest.mark.release

# Twins and specificity run fewer cases than the default budget, to keep the
# file fast; the faulty targets themselves get the full default budget.
CONTROL_EXAMPLES = 100
# vLLM's SPDX copyright line, spelled in two parts so that this file does not
# itself carry it (the repository is checked for that line too).
VENDORED_MARK = "Copyright contributors" + " to the vLLM project"

BY_NAME = {entry.name: entry for entry in CORPUS}
WITNESSES = [entry for entry in CORPUS if entry.kind == "witness"]


def options(
    entry: FaultyTarget, properties: tuple[str, ...], examples: int
) -> CheckOptions:
    return CheckOptions(
        scenarios=(entry.scenario,),
        properties=properties,
        profile=entry.profile,
        policy=entry.policy,
        examples=examples,
        seed=0,
    )


def twin_checks() -> list[tuple[str, str, str, tuple[str, ...], str]]:
    """(reference, scenario, profile, properties, an entry with that policy):
    one check per reference, scenario, profile and policy, judging every
    property an entry there is designated for.

    One check of several properties is the checks of each alone: the cases
    drawn depend on the target, scenario, profile, policy and seed, never on
    the properties judged, so each property is judged on the same cases, and
    a twin passes only if none of them fails on any."""
    grouped: dict[tuple[str, str, str, object], tuple[str, list[str]]] = {}
    for entry in CORPUS:
        key = (entry.reference, entry.scenario, entry.profile, entry.policy)
        _, designated = grouped.setdefault(key, (entry.name, []))
        if entry.designated not in designated:
            designated.append(entry.designated)
    return [
        (ref, scen, prof, tuple(designated), name)
        for (ref, scen, prof, _), (name, designated) in grouped.items()
    ]


def test_registry_is_consistent() -> None:
    assert len(BY_NAME) == len(CORPUS), "corpus names must be unique"
    for entry in CORPUS:
        assert set(entry.caught_by) <= set(PROPERTY_NAMES), entry.name
        assert entry.scenario in SCENARIOS, entry.name
        assert entry.docstring and entry.upstream, entry.name
    # One witness per property, each designating a different one.
    assert sorted(entry.designated for entry in WITNESSES) == sorted(PROPERTY_NAMES)
    assert corpus.entry("witness-idle") is BY_NAME["witness-idle"]
    with pytest.raises(CorpusError, match="unknown faulty target"):
        corpus.entry("no-such-bug")
    with pytest.raises(CorpusError, match="unknown reference"):
        corpus.reference_path("v1")


def test_bad_entries_are_refused() -> None:
    good = BY_NAME["witness-idle"]
    with pytest.raises(CorpusError, match="bug_class"):
        FaultyTarget(**{**good.__dict__, "bug_class": "typo"})
    with pytest.raises(CorpusError, match="must not be empty"):
        FaultyTarget(**{**good.__dict__, "edits": ()})


def test_an_edit_must_match_exactly_once() -> None:
    with pytest.raises(CorpusError, match="found 0"):
        corpus.apply_edits("a b", (("c", "d"),), "t")
    with pytest.raises(CorpusError, match="found 2"):
        corpus.apply_edits("a a", (("a", "d"),), "t")
    assert corpus.apply_edits("a b", (("a", "c"), ("c b", "ok")), "t") == "ok"


@pytest.mark.parametrize("name", ["v29", "v33"])
def test_references_load_and_are_written_from_scratch(name: str) -> None:
    path = corpus.reference_path(name)
    assert VENDORED_MARK not in path.read_text()
    target = load_target(corpus.REFERENCES[name][1], path)
    assert target.api.has("reuse")


def test_v1_entries_expect_only_properties_run_on_v1() -> None:
    v1 = [entry for entry in CORPUS if entry.runner == "v1"]
    assert v1 and all(entry.scenario in ("step", "profile", "ubatch") for entry in v1)
    for entry in v1:
        assert all(PROPERTIES[name].applies_to("v1") for name in entry.caught_by), (
            entry.name
        )


def test_the_v1_twin_loads_as_the_v1_runner_and_is_written_from_scratch() -> None:
    path = corpus.reference_path("v1-v33")
    assert VENDORED_MARK not in path.read_text()
    target = load_target("0.33.0", path, runner="v1")
    assert target.runner == "v1"
    assert {entry.runner for entry in CORPUS if entry.reference == "v1-v33"} == {"v1"}


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_materialised_file_loads_with_its_docstring(name: str, tmp_path: Path) -> None:
    entry = BY_NAME[name]
    reference = corpus.reference_path(entry.reference).read_text()
    path = corpus.materialize(entry, tmp_path)
    text = path.read_text()
    assert text != reference and VENDORED_MARK not in text
    for _, new in entry.edits:
        assert new in text
    doc = load_target(entry.vllm, path, runner=entry.runner).dp_utils.__doc__ or ""
    assert doc.startswith(f"Faulty target {name!r}")
    assert entry.docstring in " ".join(doc.split())


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_faulty_target_is_caught_by_its_property(name: str, tmp_path: Path) -> None:
    entry = BY_NAME[name]
    target = load_target(
        entry.vllm, corpus.materialize(entry, tmp_path), runner=entry.runner
    )
    # Without shrinking: only the designated property is run, so the first
    # failing case already breaks it, and a shrink would keep to it (check's
    # shrink predicate accepts only cases failing the property first broken).
    # Shrinking every entry cost about 55 s of CPU in `make test`; `dpsim
    # bench --measure corpus` shrinks each, and tests/test_check.py and
    # tests/test_search_release.py pin shrunk corpus cases.
    report = run_check(
        target,
        replace(options(entry, (entry.designated,), DEFAULT_EXAMPLES), shrink=False),
    )
    run = report.first_failure
    assert run is not None, (
        f"{name}: {entry.designated} not caught in {report.examples} cases"
    )
    assert run.finding is not None
    assert run.finding.primary.property == entry.designated


@pytest.mark.parametrize(
    ("reference", "scenario", "profile", "properties", "like"),
    twin_checks(),
    ids=lambda value: "+".join(value) if isinstance(value, tuple) else str(value),
)
def test_reference_twin_passes(
    reference: str, scenario: str, profile: str, properties: tuple[str, ...], like: str
) -> None:
    entry = BY_NAME[like]
    target = load_target(
        entry.vllm, corpus.reference_path(reference), runner=entry.runner
    )
    report = run_check(target, options(entry, properties, CONTROL_EXAMPLES))
    failed = report.first_failure
    assert failed is None, (
        f"reference {reference}: {failed and failed.finding and failed.finding.primary}"
    )


@pytest.mark.parametrize("name", [entry.name for entry in WITNESSES])
def test_witness_breaks_no_other_property(name: str, tmp_path: Path) -> None:
    entry = BY_NAME[name]
    # In the contract profile a 0-token rank next to busy ones skips its
    # forward pass while the others run theirs, so every target, vLLM's own
    # releases included, fails no-hang there; it says nothing about the witness.
    others = tuple(
        prop
        for prop in PROPERTY_NAMES
        if prop != entry.designated
        and not (prop == "no-hang" and entry.profile == "contract")
    )
    target = load_target(
        entry.vllm, corpus.materialize(entry, tmp_path), runner=entry.runner
    )
    report = run_check(target, options(entry, others, CONTROL_EXAMPLES))
    failed = report.first_failure
    assert failed is None, (
        f"{name}: {failed and failed.finding and failed.finding.primary}"
    )
