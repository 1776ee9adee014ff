"""Where in vLLM's source a running rank is.

The runner lane runs real vLLM code compiled from release files (or a tree)
under their real names, mixed with dpsim's own frames (stand-ins, the
simulator). Which frames are vLLM's is decided by the code object's file name
against a registry that :func:`~dpsim.lanes.runner.extract.real_class` and the
lane's module loads fill (:func:`register_file`): a path match by name
(``.../vllm/...``) could take dpsim's own or an installed vLLM's files for the
target's.
"""

from __future__ import annotations

from pathlib import Path
from types import FrameType

#: File name (as compiled) -> how locations show it ("v1/worker/gpu/model_runner.py").
_FILES: dict[str, str] = {}


def register_file(path: Path | str) -> str:
    """Count code compiled from ``path`` as vLLM's; returns its display name
    (the path below the ``vllm`` package, or the file name)."""
    name = str(path)
    shown = _FILES.get(name)
    if shown is None:
        shown = display_name(Path(name))
        _FILES[name] = shown
    return shown


def display_name(path: Path) -> str:
    """``path`` below its innermost ``vllm`` folder (``v1/worker/gpu_worker.py``);
    the file name alone when it is not inside one."""
    parts = path.parts
    for index in range(len(parts) - 2, -1, -1):
        if parts[index] == "vllm":
            return "/".join(parts[index + 1 :])
    return path.name


def is_vllm_file(filename: str) -> bool:
    return filename in _FILES


def frame_location(frame: FrameType) -> str:
    """``model_runner.py:1832 in execute_model`` for one vLLM frame."""
    code = frame.f_code
    return f"{_FILES[code.co_filename]}:{frame.f_lineno} in {code.co_name}"


def vllm_location(frame: FrameType | None) -> str | None:
    """The innermost vLLM frame from ``frame`` outward, as a location; None
    when no frame on the stack is vLLM's."""
    while frame is not None:
        if frame.f_code.co_filename in _FILES:
            return frame_location(frame)
        frame = frame.f_back
    return None


def vllm_stack(frame: FrameType | None) -> tuple[str, ...]:
    """Every vLLM frame from ``frame`` outward, innermost first."""
    found: list[str] = []
    while frame is not None:
        if frame.f_code.co_filename in _FILES:
            found.append(frame_location(frame))
        frame = frame.f_back
    return tuple(found)
