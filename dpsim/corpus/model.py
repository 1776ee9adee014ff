"""What a faulty target is, and how its file is made from a reference twin.

Faulty files are produced at use time (:func:`materialize`), never kept as
copies, so every fault stays a readable diff against one correct reference,
and an edit that no longer applies fails loudly rather than planting nothing.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from dpsim.errors import UsageError
from dpsim.records.case import PROFILES
from dpsim.records.policy import CapturePolicy

_HERE = Path(__file__).resolve().parent

#: Reference name -> (file, the vLLM release whose API it has, the runner whose
#: sync it replaces: ``v2``'s ``dispatch_cg_and_sync_dp`` or ``v1``'s
#: ``coordinate_batch_across_dp``).
REFERENCES: dict[str, tuple[str, str, str]] = {
    "v29": ("reference_v29.py", "0.29.0", "v2"),
    "v33": ("reference_v33.py", "0.33.0", "v2"),
    "v1-v33": ("reference_v1_v33.py", "0.33.0", "v1"),
}

# Bug classes, in the words of UPSTREAM_BUGS.md.
PER_RANK_FOR_AGREED = "a per-rank value used where an agreed one was needed"
AGREED_FOR_PER_RANK = "an agreed value used where the rank's own was needed"
COLLECTIVE_SKIPPED = "a collective skipped, or issued a different number of times"
EXTRA_COLLECTIVE = "an extra collective, or a different tensor shape, on some ranks"
EAGER_AND_GRAPH = "eager on some ranks, a graph on others"
DUMMY_NOT_SHAPED = "a dummy (idle) batch not shaped like a real one"
DRAFTER_PADDING = "target and drafter padding differently"
UBATCH_BOUNDARY = "microbatching boundary cases"
GRAPH_MISSED = "a graph the table has, missed on every rank alike"
BUG_CLASSES = (
    PER_RANK_FOR_AGREED,
    AGREED_FOR_PER_RANK,
    COLLECTIVE_SKIPPED,
    EXTRA_COLLECTIVE,
    EAGER_AND_GRAPH,
    DUMMY_NOT_SHAPED,
    DRAFTER_PADDING,
    UBATCH_BOUNDARY,
    GRAPH_MISSED,
)
KINDS = ("issue", "witness")


class CorpusError(UsageError):
    """A corpus entry that does not apply to its reference, or an unknown name."""


@dataclass(frozen=True)
class FaultyTarget:
    """One planted bug: how to make it, what it models, and what must catch it."""

    name: str
    #: ``issue`` (an upstream bug class) or ``witness`` (one property alone).
    kind: str
    #: Which twin it edits: a key of :data:`REFERENCES`.
    reference: str
    #: ``(old_text, new_text)`` substitutions; each old_text occurs exactly once.
    edits: tuple[tuple[str, str], ...]
    bug_class: str
    #: Upstream PRs/issues it is modelled on ("vllm#N", "ascend#N").
    upstream: tuple[str, ...]
    #: What is wrong and how it shows in production; the faulty file's docstring.
    docstring: str
    #: Properties expected to fail; the first is the designated one.
    caught_by: tuple[str, ...]
    #: The scenario that exposes it.
    scenario: str
    #: The generator profile that exposes it: ``caller`` (what vLLM's model
    #: runner passes) where possible, ``contract`` where only the documented
    #: contract reaches the bug (0-token ranks, all-idle steps).
    profile: str = "caller"
    #: A capture policy that puts the bug within the default budget (``dpsim
    #: check --policy``), for bugs at a boundary the generators reach only by
    #: chance; None lets the generators draw policies.
    policy: CapturePolicy | None = None

    def __post_init__(self) -> None:
        problems = [
            f"{label} {value!r} is not one of {', '.join(known)}"
            for label, value, known in (
                ("kind", self.kind, KINDS),
                ("reference", self.reference, tuple(REFERENCES)),
                ("bug_class", self.bug_class, BUG_CLASSES),
                ("profile", self.profile, PROFILES),
            )
            if value not in known
        ]
        if not self.edits or not self.caught_by or not self.upstream:
            problems.append("edits, caught_by and upstream must not be empty")
        if problems:
            raise CorpusError(f"corpus entry {self.name!r}: {'; '.join(problems)}")

    @property
    def vllm(self) -> str:
        """The release whose manager and enums the faulty file runs against."""
        return REFERENCES[self.reference][1]

    @property
    def runner(self) -> str:
        """The model runner whose sync the faulty file replaces (``--runner``)."""
        return REFERENCES[self.reference][2]

    @property
    def designated(self) -> str:
        return self.caught_by[0]

    @property
    def file_name(self) -> str:
        return self.name.replace("-", "_") + ".py"


def reference_path(name: str) -> Path:
    """The correct twin ``name`` (a key of :data:`REFERENCES`) as a loadable file."""
    if name not in REFERENCES:
        raise CorpusError(f"unknown reference {name!r}; known: {', '.join(REFERENCES)}")
    return _HERE / REFERENCES[name][0]


def apply_edits(text: str, edits: tuple[tuple[str, str], ...], label: str) -> str:
    """``text`` with every edit applied, refusing any old_text not found exactly once.

    Each edit is checked against the text as the earlier edits left it, so a
    stale entry fails loudly instead of silently planting nothing.
    """
    for old, new in edits:
        found = text.count(old)
        if found != 1:
            raise CorpusError(
                f"{label}: edit expects exactly one {old.strip()[:60]!r}, found {found}"
            )
        text = text.replace(old, new)
    return text


def source(entry: FaultyTarget) -> str:
    """The faulty module's text: the reference, edited, under the entry's docstring."""
    edited = apply_edits(
        reference_path(entry.reference).read_text(), entry.edits, entry.name
    )
    return _with_docstring(edited, _module_docstring(entry))


def materialize(entry: FaultyTarget, directory: Path) -> Path:
    """Write ``entry``'s faulty dp_utils into ``directory``; return its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / entry.file_name
    path.write_text(source(entry))
    return path


def _module_docstring(entry: FaultyTarget) -> str:
    upstream = ", ".join(entry.upstream)
    # V2 is the default runner of the references' releases: only V1 needs naming.
    runner = f" --runner {entry.runner}" if entry.runner != "v2" else ""
    return (
        f"Faulty target {entry.name!r} (dpsim corpus): {entry.docstring}\n\n"
        f"Bug class: {entry.bug_class}. Modelled on: {upstream}.\n"
        f"Expected to fail: {', '.join(entry.caught_by)} "
        f"(scenario {entry.scenario}). Made from dpsim/corpus/"
        f"{REFERENCES[entry.reference][0]}; run with --vllm {entry.vllm}{runner}.\n"
    )


def _with_docstring(text: str, docstring: str) -> str:
    """``text`` with its module docstring replaced by ``docstring``."""
    body = ast.parse(text).body
    first = body[0] if body else None
    rest = text
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        rest = "".join(text.splitlines(keepends=True)[first.end_lineno or 0 :])
    quoted = docstring.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
    return f'"""{quoted}"""\n{rest}'
