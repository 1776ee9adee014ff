"""The target's lines and branches no run can reach, each with its reason.

The entries are the branch-reach work's (issue 19); the mechanism, matching by
text so an entry survives line moves between releases, is
:mod:`dpsim.coverage.marks`. ``dpsim check --coverage`` lists a matched branch
apart with its reason instead of as missing.
"""

from __future__ import annotations

from .marks import Unreachable

UNREACHABLE: tuple[Unreachable, ...] = ()
