"""Text edits at AST positions, so a mutant differs from its original by a few
characters.

Why not ``ast.unparse`` the mutated tree: that rewrites the whole file (quotes,
line breaks, comments gone), so every survivor's diff to review would be the
whole module. Editing the source text at the node's own span keeps the diff to
the mutated line, in the file's own formatting.
"""

from __future__ import annotations

import ast
import difflib
import re
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Edit:
    """Replace ``text[start:end]`` (character offsets) with ``replacement``."""

    start: int
    end: int
    replacement: str


class SourceMap:
    """Character offsets of AST positions in one source text.

    AST columns count UTF-8 bytes; a comment with a non-ASCII character earlier
    on the line would shift a character offset, so columns are converted.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self._lines = text.splitlines(keepends=True)
        self._starts = [0]
        for line in self._lines:
            self._starts.append(self._starts[-1] + len(line))

    def offset(self, lineno: int, col: int) -> int:
        line = self._lines[lineno - 1] if lineno - 1 < len(self._lines) else ""
        prefix = line.encode("utf-8")[:col].decode("utf-8", errors="ignore")
        return self._starts[lineno - 1] + len(prefix)

    def start(self, node: ast.AST) -> int:
        return self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        return self.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]

    def segment(self, node: ast.AST) -> str:
        return self.text[self.start(node) : self.end(node)]

    def replace(self, node: ast.AST, replacement: str) -> Edit:
        return Edit(self.start(node), self.end(node), replacement)

    def token_between(
        self, start: int, end: int, pattern: str, replacement: str
    ) -> Edit | None:
        """Replace the first ``pattern`` match in ``text[start:end]``, ignoring
        comments: the gap between two operands holds the operator token, and
        perhaps brackets, line breaks and comments."""
        gap = _blank_comments(self.text[start:end])
        found = re.search(pattern, gap)
        if found is None:
            return None
        return Edit(start + found.start(), start + found.end(), replacement)

    def line_of(self, offset: int) -> int:
        low, high = 0, len(self._starts) - 1
        while low < high:
            middle = (low + high + 1) // 2
            if self._starts[middle] <= offset:
                low = middle
            else:
                high = middle - 1
        return low + 1


def _blank_comments(text: str) -> str:
    # Same length, so match offsets stay offsets into the original text.
    return re.sub(r"#[^\n]*", lambda match: " " * len(match.group()), text)


def apply(text: str, edits: tuple[Edit, ...]) -> str:
    """``text`` with non-overlapping ``edits`` applied."""
    out = []
    position = 0
    for edit in sorted(edits):
        if edit.start < position:
            raise ValueError(f"overlapping edits at offset {edit.start}")
        out.append(text[position : edit.start])
        out.append(edit.replacement)
        position = edit.end
    out.append(text[position:])
    return "".join(out)


def within(text: str, base: int, edits: tuple[Edit, ...]) -> str:
    """``text`` (which starts at offset ``base`` of its file) with ``edits``."""
    shifted = tuple(
        Edit(edit.start - base, edit.end - base, edit.replacement) for edit in edits
    )
    return apply(text, shifted)


def unified_diff(original: str, mutated: str, name: str, label: str) -> str:
    return "".join(
        difflib.unified_diff(
            original.splitlines(keepends=True),
            mutated.splitlines(keepends=True),
            fromfile=f"a/{name}",
            tofile=f"b/{name} ({label})",
            n=2,
        )
    )
