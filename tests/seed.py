"""The seed file: the sync this project started from, derived at test time.

It is vLLM 0.29.0's own ``vllm/v1/worker/gpu/dp_utils.py`` with one more
agreed value: a ``num_reqs`` row in the all-reduce, and a ``DPSyncState``
field holding it (a FULL graph's padded request count, else the most any rank
scheduled). vLLM's text stays in the release cache; only these edits are
dpsim's. The result is byte for byte the file the reviewed equivalent mutants
of ``dpsim/mutate/equivalent.toml`` are keyed to (by its SHA-256).
"""

from __future__ import annotations

from pathlib import Path

from dpsim.targets.cache import ensure_release

RELEASE = "0.29.0"
DP_UTILS = "v1/worker/gpu/dp_utils.py"

#: (text in 0.29.0's file, what it becomes): each text occurs exactly once.
_EDITS = (
    (
        "    eager: bool\n",
        "    eager: bool\n"
        "    # Agreed upper bound on any rank's request count. Holds the padded"
        " count when\n"
        "    # a FULL descriptor imposed one, else the most any rank scheduled.\n"
        "    num_reqs: int\n",
    ),
    ("torch.zeros(4, dp_size", "torch.zeros(5, dp_size"),
    (
        "    tensor[3][dp_rank] = max_query_len or -1  # (-1 means None)\n",
        "    tensor[3][dp_rank] = max_query_len or -1  # (-1 means None)\n"
        "    tensor[4][dp_rank] = num_reqs\n",
    ),
    (
        "    max_query_lens_across_dp = tensor[3]\n",
        "    max_query_lens_across_dp = tensor[3]\n"
        "    num_reqs_across_dp = tensor[4]\n",
    ),
    (
        "                eager=True,\n",
        "                eager=True,\n"
        "                num_reqs=int(num_reqs_across_dp.max().item()),\n",
    ),
    (
        "        eager=False,\n",
        "        eager=False,\n"
        "        num_reqs=(\n"
        "            synced_desc.num_reqs\n"
        "            if synced_desc.cg_mode == CUDAGraphMode.FULL\n"
        "            and synced_desc.num_reqs is not None\n"
        "            else int(num_reqs_across_dp.max().item())\n"
        "        ),\n",
    ),
)


def seed_source() -> str:
    """The seed's text, from the cached 0.29.0 release's dp_utils.py."""
    text = (ensure_release(RELEASE) / DP_UTILS).read_text()
    for before, after in _EDITS:
        assert text.count(before) == 1, f"{RELEASE}'s dp_utils changed: {before!r}"
        text = text.replace(before, after)
    return text


def write_seed(directory: Path) -> Path:
    """The seed written as ``dp_utils_seed.py`` in ``directory``."""
    path = directory / "dp_utils_seed.py"
    path.write_text(seed_source())
    return path
