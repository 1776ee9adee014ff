"""The JSON Schemas of the files dpsim writes, made of the checks that read them.

A reader checks a file it was given against these before running anything
(``python -m jsonschema``, or any JSON Schema validator, draft 2020-12), and
they are published under ``docs/reference/`` (``make docs-reference``
writes them). Every value's schema is the one its reader's check declares
(:mod:`dpsim.fields`): the rank batch, reuse call, target spec and case
fields of :mod:`dpsim.cex.validate`, the policy's of
:func:`~dpsim.records.policy.policy_schema`, and the runner lane's engine
options and request streams of :mod:`dpsim.lanes.runner.stream`; the bounds
are :mod:`dpsim.limits`' and the validator's own. What a schema cannot say
(one batch per rank in every step, ``dp_size`` equal to that width, choices
and verdict ranks below the rank count, the policy's and the engine's
rules across fields, the recorded sources' hashes) only dpsim's reader
checks; the descriptions say which.
"""

from __future__ import annotations

import json
from typing import Any

from dpsim import limits
from dpsim.cex import files, validate
from dpsim.fields import object_schema, schema_of
from dpsim.records.policy import policy_schema

DIALECT = "https://json-schema.org/draft/2020-12/schema"
#: The published files, by name under docs/reference/.
COUNTEREXAMPLE_FILE = "counterexample.schema.json"
RUNNER_CASE_FILE = "runner-case.schema.json"


def counterexample_schema() -> dict[str, Any]:
    """A sync-lane counterexample file (``dpsim check``, ``versions``, ``diff``,
    the pytest suite): what :func:`dpsim.cex.files.read` accepts."""
    from dpsim.properties import PROPERTY_NAMES

    return _file(
        "dpsim counterexample file",
        "A sync-lane case with everything needed to rerun it exactly: the "
        "target, the case, the scheduling choices, the properties judged, "
        "the verdicts and the simulator's trace. dpsim's reader also checks "
        "what no schema can: one batch per rank in every step, dp_size equal "
        "to that width, choices and verdict ranks below the rank count, the "
        "policy's rules across fields, and (on replay) the recorded sources' "
        "SHA-256s.",
        {
            "kind": {"const": files.KIND},
            "schema": {"const": files.SCHEMA_VERSION},
            "dpsim_version": schema_of(validate.text_problem),
            "target": _target(),
            "case": _case(),
            "choices": {
                "description": (
                    "the simulator's scheduling choices: which rank ran at "
                    "each turn (each below the case's rank count)"
                ),
                "type": "array",
                "items": {"type": "integer", "minimum": 0},
                "maxItems": validate.MAX_CHOICES,
            },
            "properties": _names(PROPERTY_NAMES),
            "verdicts": _verdicts(PROPERTY_NAMES),
            "outcome": _outcome(),
            "trace": _trace(),
        },
    )


def runner_case_schema() -> dict[str, Any]:
    """A runner-lane case file (``dpsim check --lane runner``): what
    :func:`dpsim.lanes.runner.case.read` accepts."""
    from dpsim.lanes.runner import case as runner_case
    from dpsim.lanes.runner.stream import options_schema, streams_schema
    from dpsim.properties import ALL_PROPERTY_NAMES

    target = _target()
    target["properties"]["lane_files"] = {
        "description": "the runner lane's own source files: module -> SHA-256",
        "type": "object",
        "additionalProperties": {"type": "string", "minLength": 64, "maxLength": 64},
    }
    case = object_schema(
        (),
        ["lane", "dp_size", "seed", "policy", "options", "streams"],
        more={
            "lane": {"const": runner_case.LANE},
            "runner": {
                "description": "the model runner; absent: v2",
                "enum": list(runner_case.RUNNERS),
            },
            "dp_size": {
                "description": "DP ranks: one request stream each",
                "type": "integer",
                "minimum": 1,
                "maximum": limits.MAX_INT,
            },
            "seed": {"type": "integer", "minimum": 0, "maximum": limits.MAX_INT},
            "policy": policy_schema(),
            "options": options_schema(),
            "streams": streams_schema(),
        },
    )
    return _file(
        "dpsim runner case file",
        "A runner-lane case (a deployment, its engine options and each "
        "rank's request stream) with the target it ran on, the properties "
        "judged, the verdicts and the simulator's trace. dpsim's reader also "
        "checks what no schema can: dp_size equal to the number of streams, "
        "request ids unique across ranks, each prompt below max_model_len, "
        "requests in arrival order, the engine options' and the policy's "
        "rules across fields, and the recorded sources' SHA-256s.",
        {
            "kind": {"const": runner_case.KIND},
            "schema": {"const": runner_case.SCHEMA_VERSION},
            "lane": {"const": runner_case.LANE},
            "dpsim_version": schema_of(validate.text_problem),
            "target": target,
            "case": case,
            "properties": _names(ALL_PROPERTY_NAMES),
            "verdicts": _verdicts(ALL_PROPERTY_NAMES),
            "outcome": _outcome(),
            "trace": _trace(),
        },
    )


def _file(title: str, description: str, keys: dict[str, Any]) -> dict[str, Any]:
    """A file's schema: an open object that must hold every one of ``keys``."""
    return {
        "$schema": DIALECT,
        "title": title,
        "description": description,
        **object_schema((), list(keys), closed=False, more=keys),
    }


def _target() -> dict[str, Any]:
    return object_schema(
        validate.TARGET_FIELDS,
        ["spec", "files"],
        closed=False,
        more={
            "spec": object_schema(
                validate.SPEC_FIELDS, validate.REQUIRED_SPEC_FIELDS, closed=False
            ),
            "files": {
                "description": "every source file loaded: module name -> SHA-256",
                "type": "object",
                "propertyNames": {"pattern": validate.MODULE_PATTERN},
                "additionalProperties": {
                    "type": "string",
                    "pattern": validate.SHA256_PATTERN,
                },
            },
        },
    )


def _case() -> dict[str, Any]:
    batch = object_schema(validate.BATCH_FIELDS, validate.REQUIRED_BATCH_FIELDS)
    reuse = object_schema(validate.REUSE_FIELDS, validate.REQUIRED_REUSE_FIELDS)
    return object_schema(
        validate.CASE_FIELDS,
        [*validate.REQUIRED_CASE_FIELDS, "policy", "steps"],
        closed=False,
        more={
            "policy": policy_schema(),
            "steps": {
                "description": "steps[s][r]: what rank r passes at step s",
                "type": "array",
                "minItems": 1,
                "maxItems": validate.MAX_STEPS,
                "items": _per_rank(batch, at_least_one=True),
            },
            "reuse_calls": {
                "description": (
                    "drafter scenario, contract profile: reuse_calls[s][r] is what "
                    "rank r's drafter prefill passes at step s beside the agreement "
                    "it reuses; absent: what vLLM's drafters pass"
                ),
                "type": "array",
                "maxItems": validate.MAX_STEPS,
                "items": _per_rank(reuse, at_least_one=False),
            },
        },
    )


def _per_rank(item: dict[str, Any], *, at_least_one: bool) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "array",
        "items": item,
        "maxItems": limits.MAX_RANKS,
    }
    if at_least_one:
        schema["minItems"] = 1
    return schema


def _names(known: Any) -> dict[str, Any]:
    return {
        "description": "the properties judged",
        "type": "array",
        "items": schema_of(validate.one_of_check(known)),
        "maxItems": validate.MAX_NAMES,
    }


def _verdicts(known: Any) -> dict[str, Any]:
    verdict = object_schema(
        (),
        ["property", "message", "ranks"],
        closed=False,
        more={
            "property": schema_of(validate.one_of_check(known)),
            "phase": schema_of(validate.optional_text_check),
            "message": schema_of(validate.text_problem),
            "ranks": {
                "description": "the ranks involved, each once",
                "type": "array",
                "items": {"type": "integer", "minimum": 0},
                "uniqueItems": True,
            },
        },
    )
    return {
        "description": "each property broken, and where",
        "type": "array",
        "items": verdict,
        "maxItems": validate.MAX_NAMES,
    }


def _outcome() -> dict[str, Any]:
    return {
        "description": "the simulator's outcome of the run",
        **schema_of(validate.one_of_check(validate.OUTCOMES)),
    }


def _trace() -> dict[str, Any]:
    return {
        "description": (
            "the simulator's full per-rank trace; replay compares it byte for "
            "byte, and reading a file checks only that it is an object"
        ),
        "type": "object",
    }


def published() -> dict[str, str]:
    """Each published schema file's name and text."""
    return {
        COUNTEREXAMPLE_FILE: _encode(counterexample_schema()),
        RUNNER_CASE_FILE: _encode(runner_case_schema()),
    }


def _encode(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=1) + "\n"
