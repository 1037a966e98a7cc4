"""Stage results and the markdown report (for ``docs/agent.md``, "Checking on a real GPU")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from agents.gpu_check.compare import Check

__all__ = ["FAIL", "PASS", "SKIP", "StageResult", "Table", "exit_code", "render", "stage_from_checks"]

Status = Literal["pass", "fail", "skip"]
PASS: Status = "pass"  # noqa: S105 - a stage result, not a password
FAIL: Status = "fail"
SKIP: Status = "skip"


@dataclass(frozen=True, slots=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass
class StageResult:
    name: str
    status: Status
    reason: str  # one line: what passed, what failed, or why the stage did not run
    tables: list[tuple[str, Table]] = field(default_factory=list)  # (caption, table)
    notes: list[str] = field(default_factory=list)


def stage_from_checks(name: str, checks: Sequence[Check], *, tables: Sequence[tuple[str, Table]] = ()) -> StageResult:
    """Fails if any check failed; passes if every judged check passed (unjudged ones are named)."""
    failed = [c.name for c in checks if c.passed is False]
    unjudged = [c.name for c in checks if c.passed is None]
    if failed:
        status, reason = FAIL, "failed: " + "; ".join(failed)
    elif not any(c.passed for c in checks):
        status, reason = SKIP, "nothing could be judged"
    else:
        status, reason = PASS, f"{sum(1 for c in checks if c.passed)} checks passed"
    if unjudged:
        reason += " (not judged: " + "; ".join(unjudged) + ")"
    rows = tuple((c.name, {True: PASS, False: FAIL, None: "n/a"}[c.passed], c.detail) for c in checks)
    return StageResult(name, status, reason, [*tables, ("Checks", Table(("check", "result", "detail"), rows))])


def exit_code(stages: Sequence[StageResult]) -> int:
    """0 when no stage failed (skipped ones are in the report), 1 otherwise."""
    return 1 if any(s.status == FAIL for s in stages) else 0


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(table: Table) -> list[str]:
    lines = ["| " + " | ".join(_cell(h) for h in table.headers) + " |", "|" + "---|" * len(table.headers)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table.rows]
    return lines


def render(*, title: str, facts: Sequence[tuple[str, str]], stages: Sequence[StageResult]) -> str:
    """The whole report: the machine, a summary row per stage, then each stage's tables and notes."""
    lines = [f"### {title}", ""]
    lines += _table(Table(("", ""), tuple(facts)))
    lines += ["", *_table(Table(("stage", "result", "why"), tuple((s.name, s.status, s.reason) for s in stages)))]
    for stage in stages:
        if not stage.tables and not stage.notes:
            continue
        lines += ["", f"#### {stage.name}: {stage.status}"]
        for caption, table in stage.tables:
            lines += ["", f"{caption}:", "", *_table(table)]
        if stage.notes:
            lines += ["", *(f"- {note}" for note in stage.notes)]
    return "\n".join(lines) + "\n"
