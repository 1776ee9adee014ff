"""Target coverage for the suite's tests (the pytest plugin, ``dpsim fuzz``).

The suite's tests take no fixtures (HypoFuzz runs them outside pytest), so
the measurement a runner wants is installed here, for the process, with
:func:`measuring`; :func:`running` is what a test wraps each case's run in.
Both runners execute tests in child processes (the plugin forks one per
test, fuzz spawns workers), so a child sends its result back as
:meth:`~dpsim.coverage.result.CoverageResult.to_json` and the parent merges.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .measuring import Measurement
    from .result import CoverageResult

_active: Measurement | None = None
#: Environment variable that turns it on where no flag reaches (HypoFuzz).
ENV = "DPSIM_COVERAGE"


@contextlib.contextmanager
def measuring(target: Any) -> Iterator[Measurement]:
    """Measure ``target``'s coverage in every suite test run in the block."""
    global _active
    from .measuring import measure
    from .targets import scopes_for

    previous, _active = _active, measure(scopes_for(target))
    try:
        yield _active
    finally:
        _active = previous


def running(scenario: str, profile: str) -> contextlib.AbstractContextManager[None]:
    """The block one case runs in: traced when a measurement is installed."""
    if _active is None:
        return contextlib.nullcontext()
    return _active.running(scenario, profile)


def merged(results: list[dict[str, Any]]) -> CoverageResult | None:
    """The children's results (``to_json`` objects) as one; None when none came."""
    from .result import CoverageResult

    found: CoverageResult | None = None
    for data in results:
        result = CoverageResult.from_json(data)
        found = result if found is None else found.merged(result)
    return found


def enabled(flag: bool) -> bool:
    """The flag, or ``DPSIM_COVERAGE`` set to anything but "" or "0"."""
    import os

    return flag or os.environ.get(ENV, "") not in ("", "0")


def summary(
    results: list[dict[str, Any]], out: Any, title: str
) -> tuple[str, dict[str, Any]] | None:
    """The children's results merged, written as HTML and ``coverage.json``
    under ``out/coverage/``; the text to print and the JSON object (None when
    none came)."""
    import json
    from pathlib import Path

    from .cli import finish, html_directory

    result = merged(results)
    if result is None:
        return None
    text, data = finish(result, Path(out), title)
    (html_directory(Path(out)) / "coverage.json").write_text(
        json.dumps(data, sort_keys=True), encoding="utf-8"
    )
    return text, data
