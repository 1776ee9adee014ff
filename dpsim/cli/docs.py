"""The generated reference pages, written from the code that reads the input.

Committed under ``docs/reference/`` so the site builds without running dpsim:

- ``commands.md``: every ``dpsim`` command and sub-command with its
  ``--help`` as argparse prints it (at a fixed width, so the page does not
  depend on the terminal), then the pytest plugin's options as the plugin
  registers them, and the Hypothesis profiles it registers;
- ``counterexample.schema.json`` and ``runner-case.schema.json``: the JSON
  Schemas of :mod:`dpsim.cex.schema`, made of the readers' own checks;
- ``file-fields.md``: those schemas as tables, a field per row.

``make docs-reference`` (``python -m dpsim.cli.docs docs/reference``)
rewrites them; ``tests/test_docs.py`` fails while a committed page differs
from what this module writes, so neither a flag nor a file format can change
without its reference.

Not a sub-command (it has no ``register``): it documents the others.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from dpsim.cli import build_parser

#: Columns the help is wrapped at: the same page on every terminal.
WIDTH = 88
#: What the page says about itself, and how to regenerate it.
REGENERATE = "make docs-reference"

_HEADER = f"""\
# Commands and flags

Every command, sub-command and flag of `dpsim`, and every option the pytest
plugin adds, as their own parsers describe them. This page is generated from
those parsers (`dpsim/cli/docs.py`); do not edit it by hand: run
`{REGENERATE}` after changing a flag. `tests/test_docs.py` fails while it is
stale.

Exit statuses are on [Exit statuses](exit-codes.md); the environment
variables on [Environment variables](environment.md).
"""


def reference() -> str:
    """The whole page, as committed."""
    parser = build_parser()
    parts = [_HEADER, "## dpsim\n", _help_block(parser)]
    for path, command, summary in _commands(parser, ("dpsim",)):
        name = " ".join(path)
        parts.append(f"## {name}\n")
        if summary:
            parts.append(f"{summary}\n")
        parts.append(_help_block(command))
    parts.append(_pytest_section())
    return "\n".join(parts)


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, str]]:
    """Each sub-command under ``parser``, depth first, with its one-line help."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        summaries = {choice.dest: choice.help for choice in action._choices_actions}
        for name, command in action.choices.items():
            yield (*path, name), command, summaries.get(name) or ""
            yield from _commands(command, (*path, name))


def _help_block(parser: argparse.ArgumentParser) -> str:
    formatter = parser.formatter_class(prog=parser.prog, width=WIDTH)  # type: ignore[call-arg]
    # What format_help does, with the width fixed instead of read from the terminal.
    formatter.add_usage(
        parser.usage, parser._actions, parser._mutually_exclusive_groups
    )
    formatter.add_text(parser.description)
    for group in parser._action_groups:
        formatter.start_section(group.title)
        formatter.add_text(group.description)
        formatter.add_arguments(group._group_actions)
        formatter.end_section()
    formatter.add_text(parser.epilog)
    return f"```text\n{formatter.format_help().rstrip()}\n```\n"


class _Options:
    """Stands in for pytest's parser: records what the plugin registers."""

    def __init__(self) -> None:
        self.added: list[tuple[str, str]] = []

    def getgroup(self, name: str, description: str = "") -> _Options:
        return self

    def addoption(self, *names: str, **attributes: Any) -> None:
        self.added.append((", ".join(names), str(attributes.get("help", ""))))


def _pytest_section() -> str:
    from hypothesis import settings

    from dpsim import pytest_plugin

    options = _Options()
    pytest_plugin.pytest_addoption(options)  # type: ignore[arg-type]
    rows = "\n".join(f"| `{names}` | {_cell(text)} |" for names, text in options.added)
    profiles = "\n".join(
        f"| `{name}` | {settings.get_profile(name).max_examples:,} |"
        for name in ("dev", "ci", "nightly")
    )
    return f"""\
## pytest plugin

Installing dpsim registers its pytest plugin (a `pytest11` entry point), which
adds these options to every pytest run in that environment; each is also read
from the environment variable it names. They configure the property suite
(`pytest --pyargs dpsim.suite`) and nothing else.

| option | what it sets |
|---|---|
{rows}

Hypothesis settings profiles, chosen with Hypothesis' own
`--hypothesis-profile` (default `ci` when `CI` is set, else `dev`); they apply
to the dpsim suite only:

| profile | examples per scenario |
|---|---|
{profiles}
"""


def _cell(text: str) -> str:
    """``text`` inside a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def file_fields() -> str:
    """The published schemas as tables: an object per section, a key per row."""
    from dpsim.cex import schema

    parts = [_FIELDS_HEADER]
    for title, name, published in (
        (
            "Counterexample file",
            schema.COUNTEREXAMPLE_FILE,
            schema.counterexample_schema(),
        ),
        ("Runner case file", schema.RUNNER_CASE_FILE, schema.runner_case_schema()),
    ):
        parts.append(f"## {title}\n")
        parts.append(f"{published['description']} Schema: [{name}]({name}).\n")
        for path, node in _objects(published, ""):
            parts.append(_object_table(path, node))
    return "\n".join(parts)


_FIELDS_HEADER = f"""\
# Fields of dpsim's files

Every key of a counterexample file and of a runner case file: what it must
hold, and whether it must be there. Generated from the JSON Schemas, which are
made of the checks dpsim's readers run (`dpsim/cex/schema.py`); run
`{REGENERATE}` after changing a reader. What the files are for, and how
replay uses them, is on [File formats](file-formats.md).

An open object may carry keys not listed (dpsim ignores them); a closed one
may not.
"""


def _objects(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each object schema under ``node``, by the path a reader names it with."""
    if "properties" in node:
        yield path, node
        for key, child in node["properties"].items():
            yield from _objects(child, f"{path}.{key}" if path else key)
    for branch in node.get("anyOf", ()):
        yield from _objects(branch, path)
    if "items" in node:
        yield from _objects(node["items"], f"{path}[]")
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        yield from _objects(extra, f"{path}[KEY]")


def _object_table(path: str, node: dict[str, Any]) -> str:
    required = set(node.get("required", ()))
    closed = node.get("additionalProperties") is False
    rows = [
        f"| `{key}` | {'yes' if key in required else 'no'} | {_cell(_accepts(child))} |"
        for key, child in node["properties"].items()
    ]
    kind = "closed" if closed else "open"
    heading = f"`{path}`" if path else "Top level"
    return (
        f"### {heading}\n\nAn object ({kind}).\n\n"
        "| key | required | holds |\n|---|---|---|\n" + "\n".join(rows) + "\n"
    )


def _accepts(node: dict[str, Any]) -> str:
    """What a value must be, in words."""
    text = _shape(node)
    description = node.get("description")
    return f"{text}: {description}" if description else text


def _shape(node: dict[str, Any]) -> str:
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "anyOf" in node:
        return " or ".join(_shape(branch) for branch in node["anyOf"])
    if "enum" in node:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    kind = node.get("type")
    if kind == "integer":
        low, high = node.get("minimum"), node.get("maximum")
        if high is None:
            return f"an integer >= {low:,}"
        return f"an integer {low:,}..{high:,}"
    if kind == "boolean":
        return "true or false"
    if kind == "null":
        return "null"
    if kind == "string":
        limits = []
        if "pattern" in node:
            limits.append(f"matching `{node['pattern']}`")
        if "minLength" in node and node["minLength"] == node.get("maxLength"):
            limits.append(f"of {node['minLength']} characters")
        elif "maxLength" in node:
            limits.append(f"at most {node['maxLength']:,} characters")
        return " ".join(["a string", *limits])
    if kind == "array":
        sizes = []
        if "minItems" in node:
            sizes.append(f"at least {node['minItems']:,}")
        if "maxItems" in node:
            sizes.append(f"at most {node['maxItems']:,}")
        if node.get("uniqueItems"):
            sizes.append("no value twice")
        shown = f" ({', '.join(sizes)})" if sizes else ""
        items = node["items"]
        if "properties" in items:
            return f"a list{shown} of objects (below)"
        return f"a list{shown}, each entry {_shape(items)}"
    if kind == "object":
        if "properties" in node:
            return "an object (below)"
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            keys = node.get("propertyNames", {}).get("pattern")
            named = f", each key matching `{keys}`" if keys else ""
            return f"an object{named}, each value {_shape(extra)}"
        return "an object"
    return "any value"


#: Every generated file under docs/reference/, by name, and what writes it.
def generated() -> dict[str, str]:
    """Each generated reference file's name and text."""
    from dpsim.cex import schema

    return {
        "commands.md": reference(),
        "file-fields.md": file_fields(),
        **schema.published(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Write every generated page into the directory given (docs/reference)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if len(arguments) != 1 or not Path(arguments[0]).is_dir():
        print("usage: python -m dpsim.cli.docs DIRECTORY", file=sys.stderr)
        return 2
    for name, text in generated().items():
        (Path(arguments[0]) / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
