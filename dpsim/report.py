"""Counterexamples as people read them: one row per rank, per phase.

Rendering is kept apart from the data it renders: findings and traces hold
plain values, and only this module turns them into text.
"""

from __future__ import annotations

from collections.abc import Sequence

from dpsim.properties.base import Evidence, Phase
from dpsim.records.case import POLICY_SPACES, Case, RankBatch
from dpsim.records.policy import CapturePolicy
from dpsim.records.sync import Agreement, Descriptor
from dpsim.sim import render_table
from dpsim.terminal import printable


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    """Aligned columns; cells are escaped (they may hold a target's text)."""
    rows = [tuple(printable(cell) for cell in row) for row in rows]
    widths = [
        max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)
    ]
    lines = [
        " | ".join(
            cell.ljust(width) for cell, width in zip(line, widths, strict=True)
        ).rstrip()
        for line in (header, *rows)
    ]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(lines)


def describe_policy(policy: CapturePolicy) -> str:
    sizes = list(policy.capture_sizes)
    shown = sizes if len(sizes) <= 12 else [*sizes[:5], "...", *sizes[-3:]]
    parts = [
        f"{policy.cudagraph_mode} sizes {shown}",
        f"max_num_seqs {policy.max_num_seqs}",
        f"decode_query_len {policy.decode_query_len}",
    ]
    if policy.lora_capture_cases:
        parts.append(f"lora cases {list(policy.lora_capture_cases)}")
    if policy.varlen_decode:
        parts.append("varlen decode")
    if policy.encoder_decoder:
        parts.append("encoder-decoder model")
    if policy.max_capture_size is not None:
        parts.append(f"max capture {policy.max_capture_size}")
    if policy.microbatching is not None:
        micro = policy.microbatching
        parts.append(
            f"microbatching {micro.num_ubatches}x (decode >= {micro.decode_token_threshold}, "
            f"prefill >= {micro.prefill_token_threshold})"
        )
    if policy.drafter is not None:
        parts.append(f"drafter [{describe_policy(policy.drafter)}]")
    return ", ".join(parts)


def _bounds(uniform_token_count: int | None, max_query_len: int | None) -> str:
    """The uniform decode length and query-length bound, where set."""
    text = "" if uniform_token_count is None else f" u={uniform_token_count}"
    return text + ("" if max_query_len is None else f" q<={max_query_len}")


def _inputs_cell(inputs: RankBatch) -> str:
    text = f"{inputs.kind} {inputs.num_reqs}r/{inputs.num_tokens}t"
    text += _bounds(inputs.uniform_token_count, inputs.max_query_len)
    flags = [
        name
        for name, flag in (
            ("eager!", inputs.need_eager),
            ("ub", inputs.allow_ubatching),
            ("skip", inputs.allow_skip_drafts),
            ("cascade", inputs.cascade_attn),
        )
        if flag
    ]
    if inputs.num_active_loras:
        flags.append(f"lora={inputs.num_active_loras}")
    if inputs.num_encoder_reqs:
        flags.append(f"enc={inputs.num_encoder_reqs}")
    return " ".join([text, *flags])


def _descriptor_cell(descriptor: Descriptor) -> str:
    text = f"{descriptor.cg_mode} {descriptor.num_tokens}t"
    if descriptor.num_reqs is not None:
        text += f"/{descriptor.num_reqs}r"
    text += _bounds(descriptor.uniform_token_count, descriptor.max_query_len)
    if descriptor.num_ubatches > 1:
        text += f" x{descriptor.num_ubatches}"
    return text


def _agreement_cell(agreement: Agreement | None) -> str:
    if agreement is None:
        return "none"
    text = f"{list(agreement.num_tokens_across_dp)}"
    extras = [
        f"{key}={value}"
        for key, value in (
            ("eager", agreement.eager),
            ("uniform_token_count", agreement.uniform_token_count),
            ("num_reqs", agreement.num_reqs),
            ("skip_drafts", agreement.skip_drafts),
        )
        if value is not None
    ]
    if agreement.reports_max_query_len:
        extras.append(f"max_query_len={agreement.max_query_len}")
    return " ".join([text, *extras])


def phase_table(phase: Phase) -> str:
    rows = []
    for rank, record in enumerate(phase.records):
        if record is None:
            rows.append((str(rank), "(never got here)", "", ""))
            continue
        if record.descriptor is None:
            outcome, agreement = f"raised {record.error}", ""
        else:
            outcome = _descriptor_cell(record.descriptor)
            agreement = _agreement_cell(record.agreement)
        rows.append((str(rank), _inputs_cell(record.inputs), outcome, agreement))
    return table(("rank", "passed in", "chose", "agreed"), rows)


def render_case_run(title: str, case: Case, evidence: Evidence) -> str:
    lines = [
        printable(title),
        f"  scenario {case.scenario}, profile {case.profile}, {case.dp_size} ranks, "
        f"{len(case.steps)} step(s)"
        + (
            f", {case.num_speculative_steps} speculative tokens"
            if case.num_speculative_steps
            else ""
        ),
        f"  policy: {describe_policy(case.policy)}",
        f"  ({POLICY_SPACES.get(case.profile, case.profile)})",
        "",
    ]
    for phase in evidence.phases:
        lines.append(f"{printable(phase.name)}:")
        lines.append(_indent(phase_table(phase)))
        lines.append("")
    lines.append("where each rank stands:")
    lines.append(_indent(render_table(evidence.result)))
    return "\n".join(lines)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
