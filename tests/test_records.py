"""dpsim.records: the shared vocabulary imports without torch or a target."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import dpsim.records


def test_every_records_module_imports_without_torch() -> None:
    modules = [
        f"dpsim.records.{info.name}"
        for info in pkgutil.iter_modules(dpsim.records.__path__)
    ]
    imports = "; ".join(f"import {name}" for name in ["dpsim.records", *modules])
    probe = (
        f"import sys; {imports}; "
        "loaded = sorted(name for name in sys.modules "
        "if name == 'torch' or name.startswith(('torch.', 'dpsim.targets', 'dpsim.sim'))); "
        "print(','.join(loaded))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert completed.stdout.strip() == "", completed.stdout
