"""The documentation cannot drift from the code.

The site builds strictly (a broken link, a page left out, a missing anchor is
an error); the generated reference pages are what the code writes now; every
``dpsim ...`` command line shown in README.md and docs/ goes through the real
parser (the cheap ones run for real); and the names the reference pages list
are the ones the code has.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dpsim import cli
from dpsim.cli import build_parser, docs
from dpsim.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"
#: Pages written by dpsim.cli.docs: they quote the parsers' own examples,
#: with their descriptions beside them, and are checked against the code
#: directly instead.
GENERATED = frozenset(docs.generated())
PAGES = sorted(
    [ROOT / "README.md"]
    + [page for page in DOCS.rglob("*.md") if page.name not in GENERATED]
)


def _where(page: Path) -> str:
    return str(page.relative_to(ROOT))


# -- the site ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", built],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return built


def test_the_site_builds_strictly_with_every_page_in_it(site: Path) -> None:
    for page in DOCS.rglob("*.md"):
        relative = page.relative_to(DOCS).with_suffix("")
        html = "index.html" if relative.name == "index" else f"{relative}/index.html"
        assert (site / html).is_file(), page


def test_the_generated_reference_is_what_the_code_writes() -> None:
    stale = [
        name
        for name, text in docs.generated().items()
        if not (REFERENCE / name).is_file() or (REFERENCE / name).read_text() != text
    ]
    assert stale == [], (
        f"docs/reference/{', '.join(stale)} differ from the code: "
        f"run `{docs.REGENERATE}` and commit the result"
    )


def test_the_reference_is_the_same_on_any_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    assert docs.reference() == (REFERENCE / "commands.md").read_text()


def test_every_flag_says_what_it_does() -> None:
    def silent(parser: argparse.ArgumentParser, path: str) -> Iterator[str]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, command in action.choices.items():
                    yield from silent(command, f"{path} {name}")
            elif action.help is None:
                yield f"{path} {'/'.join(action.option_strings) or action.dest}"

    assert list(silent(build_parser(), "dpsim")) == [], "give each one a help="


# -- command lines shown in the docs -------------------------------------------------


def _command_lines(page: Path) -> Iterator[tuple[str, list[str]]]:
    """Every ``dpsim ...`` command line on ``page``: (as shown, its words)."""
    parts = re.split(r"^```(.*)$", page.read_text(), flags=re.M)
    # Text and fences alternate: prose, opening fence, block, closing fence,
    # prose... Commands are in the blocks marked as shell sessions; an
    # unmarked block is a command's output.
    texts, fences = parts[::2], parts[1::2]
    prose = texts[::2]
    for info, block in zip(fences[::2], texts[1::2], strict=True):
        if info.strip() in ("sh", "bash", "shell", "console"):
            yield from _shell_lines(block)
    for span in re.findall(r"`((?:\.venv/bin/)?dpsim [^`]+)`", "\n".join(prose)):
        shown = " ".join(span.split())
        yield shown, ["dpsim", *shlex.split(shown)[1:]]


def _shell_lines(block: str) -> Iterator[tuple[str, list[str]]]:
    joined = re.sub(r"\\\n", " ", block)
    for line in joined.splitlines():
        line = line.strip().removeprefix("$ ")
        if line.startswith(("dpsim ", ".venv/bin/dpsim ")):
            words = shlex.split(line, comments=True)
            yield " ".join(line.split()), ["dpsim", *words[1:]]


SHOWN = [
    pytest.param(words, id=f"{_where(page)}: {shown}")
    for page in PAGES
    for shown, words in _command_lines(page)
]


def _names_a_command(words: list[str]) -> bool:
    """Whether ``words`` only name a command (``dpsim policy validate``)."""
    parser: argparse.ArgumentParser = build_parser()
    for word in words:
        commands = [
            action
            for action in parser._actions
            if isinstance(action, argparse._SubParsersAction)
        ]
        if not commands or word not in commands[0].choices:
            return False
        parser = commands[0].choices[word]
    return True


def test_the_docs_show_command_lines() -> None:
    # The extraction must find the tour's, the reference's and the findings'.
    shown = {" ".join(param.values[0]) for param in SHOWN}  # type: ignore[arg-type]
    assert len(SHOWN) > 150
    assert "dpsim check --vllm 0.34.0 --scenario step" in shown
    assert "dpsim policy validate docs/policies/vllm-default.toml" in " | ".join(shown)


@pytest.mark.parametrize("words", SHOWN)
def test_a_command_line_in_the_docs_parses(words: list[str]) -> None:
    arguments = words[1:]
    if _names_a_command(arguments):
        return
    parser = build_parser(arguments[0] if arguments else None)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(arguments)
    except SystemExit as exit:  # --help prints and exits 0
        assert exit.code == 0
    except UsageError as error:
        pytest.fail(f"`{' '.join(words)}` no longer parses: {error}")


HELP_LINES = [param for param in SHOWN if "--help" in param.values[0]]  # type: ignore[operator]


@pytest.mark.parametrize("words", HELP_LINES)
def test_a_help_line_in_the_docs_runs(
    words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit:
        cli.main(words[1:])
    assert exit.value.code == 0
    assert "usage: dpsim" in capsys.readouterr().out


def test_the_docs_show_help_lines() -> None:
    assert HELP_LINES


def _makefile_releases() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(
        re.findall(
            r"\d+\.\d+\.\d+", " ".join(re.findall(r"^\w*RELEASES \?=.*$", text, re.M))
        )
    )


def _runs_cheaply(words: list[str]) -> bool:
    """``dpsim targets`` of releases ``make test`` caches (it loads them and
    shows their API), and ``dpsim policy show`` of a shipped policy."""
    releases = _makefile_releases()
    arguments = words[1:]
    if arguments[:1] == ["targets"]:
        named = [word for word in arguments[1:] if not word.startswith("-")]
        options = {word for word in arguments[1:] if word.startswith("-")}
        return (
            bool(named)
            and options <= {"--runner", "--quiet"}
            and all(word in releases | {"v1", "v2"} for word in named)
        )
    if arguments[:2] == ["policy", "show"]:
        vllm = arguments[arguments.index("--vllm") + 1] if "--vllm" in arguments else ""
        return (ROOT / arguments[2]).is_file() and vllm in releases
    return False


CHEAP = [param for param in SHOWN if _runs_cheaply(param.values[0])]  # type: ignore[arg-type]


@pytest.mark.release
@pytest.mark.parametrize("words", CHEAP)
def test_a_cheap_line_in_the_docs_runs(
    words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Shown in the docs, and cheap where ``make test`` has fetched the
    releases: it runs and exits 0."""
    arguments = [
        str(ROOT / word) if (ROOT / word).is_file() else word for word in words[1:]
    ]
    assert cli.main(arguments) == 0, capsys.readouterr().err


def test_the_docs_show_cheap_lines_of_both_kinds() -> None:
    kinds = {tuple(param.values[0][1:2]) for param in CHEAP}  # type: ignore[index]
    assert kinds == {("targets",), ("policy",)}


# -- names the reference pages list --------------------------------------------------


def _pytest_options() -> set[str]:
    from dpsim import pytest_plugin

    options = docs._Options()
    pytest_plugin.pytest_addoption(options)  # type: ignore[arg-type]
    return {name for names, _ in options.added for name in names.split(", ")}


def test_every_pytest_option_the_docs_use_exists() -> None:
    known = _pytest_options()
    used = {
        (_where(page), option)
        for page in PAGES
        for option in re.findall(r"--dpsim-[a-z-]+", page.read_text())
    }
    assert [entry for entry in sorted(used) if entry[1] not in known] == []


def test_the_reference_pages_list_every_name_the_code_has() -> None:
    from dpsim.properties import ALL_PROPERTY_NAMES
    from dpsim.records.case import PROFILES
    from dpsim.scenarios import SCENARIOS

    pages = {
        "properties.md": ALL_PROPERTY_NAMES,
        "scenarios-and-profiles.md": (*SCENARIOS, *PROFILES),
    }
    missing = [
        f"{page}: {name}"
        for page, names in pages.items()
        for name in names
        if f"`{name}`" not in (REFERENCE / page).read_text()
    ]
    assert missing == []


def test_every_environment_variable_dpsim_reads_is_documented() -> None:
    source = "\n".join(path.read_text() for path in (ROOT / "dpsim").rglob("*.py"))
    # DPSIM_ORIGIN is an attribute of rebuilt classes, not a variable.
    variables = set(re.findall(r"\bDPSIM_[A-Z_]+[A-Z]\b", source)) - {"DPSIM_ORIGIN"}
    assert len(variables) > 10
    page = (REFERENCE / "environment.md").read_text()
    assert sorted(name for name in variables if f"`{name}`" not in page) == []


def test_every_make_target_is_documented() -> None:
    phony = re.search(r"^\.PHONY: (.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert phony is not None
    page = (REFERENCE / "make.md").read_text()
    assert [t for t in phony.group(1).split() if f"`make {t}`" not in page] == []


# -- the front page ------------------------------------------------------------------

README = ROOT / "README.md"


def test_the_readme_is_a_front_page_not_a_reference() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < 200
    assert not re.search(r"^\|", text, re.M), "tables belong on their docs page"
    assert "make test" in text and "make check" in text


def test_the_readme_links_every_guide(site: Path) -> None:
    linked = set(re.findall(r"\]\((docs/[^)#]+)", README.read_text()))
    guides = {_where(page) for page in (DOCS / "how-to").glob("*.md")}
    assert guides - linked == set()
    assert "docs/tutorial.md" in linked


def test_every_link_in_the_readme_resolves(site: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)]+)\)", README.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        if not (ROOT / path).exists():
            broken.append(target)
        elif anchor and path.startswith("docs/") and path.endswith(".md"):
            page = Path(path).relative_to("docs").with_suffix("")
            html = site / (
                "index.html" if page.name == "index" else f"{page}/index.html"
            )
            if f'id="{anchor}"' not in html.read_text():
                broken.append(target)
    assert broken == []
