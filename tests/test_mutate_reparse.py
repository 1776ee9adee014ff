"""A mutant is judged by reparsing its def alone only where that gives the
whole file's answer: any edit inside a def, judged both ways, agrees."""

from __future__ import annotations

import ast
import textwrap

from hypothesis import given, settings
from hypothesis import strategies as st

from dpsim.mutate.mutants import generate
from dpsim.mutate.reparse import MutantJudge
from dpsim.mutate.source import Edit, apply

MODULE = textwrap.dedent(
    '''
    """A module with every kind of unit: functions, methods, decorators,
    closures, async defs, comments after a def's last line."""
    import functools

    LIMIT = 3


    def helper(num_tokens: int) -> int:
        return num_tokens + 1  # trailing comment


    @functools.cache
    def cached(count: int) -> int:
        if count > LIMIT:
            return count - 1
        return max(count, 0)


    class Runner:
        scale = 2

        def decide(self, num_tokens: int, dp_size: int) -> int:
            def pick(count: int, eager: bool = False) -> int:
                return count if eager else count * 2

            padded = pick(num_tokens)
            if dp_size > 1 and num_tokens != 0:
                padded = max(padded, num_tokens)
            text = """a string
            over lines"""
            return padded + len(text)

        @staticmethod
        def counts(values: list[int]) -> list[int]:
            return [value for value in values if value >= 0]

        async def wait(self, num_reqs: int) -> int:
            total = 0
            for index in range(num_reqs):
                total += index
            return total
    def tail(x: int) -> int: return x * 2
    '''
)

#: Fragments an edit may put in: brackets, quotes, colons, indentation and
#: line breaks are what could make a def's lines parse differently alone.
FRAGMENTS = st.sampled_from(
    ["", " ", "(", ")", "[", "]", '"', '"""', "'", ":", "\n", "\n    ", "\\\n",
     "#", "pass", "x", "1", "+", "-", "==", "!=", "not ", "max", "min", ",",
     "def f():", "else:", "\n        return 0\n", "@", ";"]
)  # fmt: skip


def whole_file_answer(original: str, mutated: str) -> bool:
    try:
        tree = ast.parse(mutated)
    except SyntaxError:
        return False
    return ast.dump(tree) != ast.dump(ast.parse(original))


@settings(max_examples=300, deadline=None, database=None)
@given(
    st.lists(
        st.tuples(st.integers(0, len(MODULE)), st.integers(0, 12), FRAGMENTS),
        min_size=1,
        max_size=2,
    )
)
def test_a_judged_edit_agrees_with_parsing_the_whole_file(
    picks: list[tuple[int, int, str]],
) -> None:
    edits: list[Edit] = []
    for start, length, replacement in sorted(picks):
        if edits and start < edits[-1].end:
            continue
        edits.append(Edit(start, min(start + length, len(MODULE)), replacement))
    mutated = apply(MODULE, tuple(edits))
    judged = MutantJudge(MODULE).is_mutant(mutated, tuple(edits))
    assert judged == whole_file_answer(MODULE, mutated)


def test_every_generated_mutant_is_one_the_whole_file_accepts() -> None:
    mutants = generate(MODULE, functions=("helper", "cached", "Runner.decide"))
    assert len(mutants) > 10
    for mutant in mutants:
        assert whole_file_answer(MODULE, mutant.text), mutant.id


def test_the_units_cover_the_methods_so_the_shortcut_is_taken() -> None:
    judge = MutantJudge(MODULE)
    offset = MODULE.index("padded = pick")
    edit = (Edit(offset, offset + len("padded"), "padded ="),)
    # Invalid alone and in the file: the unit answers without the file.
    assert judge._unit_holding(edit) is not None
    assert not judge.is_mutant(apply(MODULE, edit), edit)
    spaced = (Edit(offset, offset + len("padded = "), "padded  =  "),)
    assert not judge.is_mutant(apply(MODULE, spaced), spaced)
