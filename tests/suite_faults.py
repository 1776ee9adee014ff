"""Faulty vLLM trees and files for the CI-integration tests, derived at test time.

Each is vLLM 0.20.0's own dp_utils.py (from the dpsim cache, never committed)
with one line changed, so the suite has a real bug to find in real code.
"""

from __future__ import annotations

from pathlib import Path

from dpsim.targets.cache import ensure_release

RELEASE = "0.20.0"
DP_UTILS = "v1/worker/gpu/dp_utils.py"

#: Each rank pads to its own token count instead of the maximum: ranks
#: disagree only when their batches differ, so a search has to look for it
#: (the simplest case, Hypothesis' first, passes).
OWN_PADDING = (
    "synced_num_tokens = int(num_tokens_across_dp.max().item())",
    "synced_num_tokens = num_tokens",
)


def faulty_source(change: tuple[str, str]) -> str:
    original = (ensure_release(RELEASE) / DP_UTILS).read_text()
    before, after = change
    assert original.count(before) == 1, f"{RELEASE}'s dp_utils changed: {before!r}"
    return original.replace(before, after)


def write_faulty(change: tuple[str, str], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(faulty_source(change))
    return path
