"""Where the real code comes from, and how it is run without vLLM's dependencies.

``load_target("0.29.0")`` fetches (once) and loads a release; a directory
loads a source tree or installed package; ``load_target("0.29.0",
"dp_utils.py")`` runs a single file against that release's manager and enums.
See :mod:`dpsim.targets.shim` for how, and :mod:`dpsim.targets.adapters` for
the uniform call interface over every version's API.

A target is one model runner's sync: V2's (``v1/worker/gpu/dp_utils.py``,
0.18 and later, the default where it exists) or, with ``runner="v1"``, the
V1 runner's ``coordinate_batch_across_dp`` and its caller method
(:mod:`dpsim.targets.v1`, 0.11.1 to 0.33, the default before 0.18). Both
offer :class:`~dpsim.targets.api.TargetAPI`.
"""

from dpsim.targets.adapters import SyncAPI
from dpsim.targets.load import Target, load_spec, load_target
from dpsim.targets.spec import DEFAULT_RELEASE, TargetSpec, parse_target

__all__ = [
    "DEFAULT_RELEASE",
    "SyncAPI",
    "Target",
    "TargetSpec",
    "load_spec",
    "load_target",
    "parse_target",
]
