"""The frontier: each dynamic policy's knob swept, cost against SLO misses, per burst source (docs/replay.md).

Every point is one replay of the same pod list; its cost is read against the static baselines
of the same usage. ``frontier_svg`` draws the points as a hand-written SVG (no plotting library):
x is the share of workload-seconds missed on a log scale, y the cost change against
static-whole, one line per policy and burst source, the shipped default ringed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

from allocator.replay._compare import SHIPPED, ReplayInputs, run_policy
from allocator.replay._replay import Policy, ReplayConfig
from allocator.risk import DEFAULT_MISS_TARGET, MissTarget

__all__ = ["FRONTIER_KNOBS", "FrontierPoint", "Knob", "format_frontier", "frontier", "frontier_svg"]


@dataclass(frozen=True, slots=True)
class Knob:
    """One setting of a policy's knob: its label and the replay's configuration."""

    policy: Policy
    label: str  # e.g. "headroom 0.5", "targets x1"
    config: ReplayConfig
    shipped: bool = False


def _targets(scale: float) -> MissTarget:
    return MissTarget(memory=DEFAULT_MISS_TARGET.memory * scale, sm=DEFAULT_MISS_TARGET.sm * scale)


def _knobs() -> tuple[Knob, ...]:
    current = tuple(
        Knob("dynamic-current-use", f"headroom {h:g}", ReplayConfig(policy="dynamic-current-use", headroom=h))
        for h in (0.2, 0.5, 1.0)
    )
    # agent-default's knob: its tier-less miss targets, scaled together (x1: the shipped targets).
    agent = tuple(
        Knob(
            SHIPPED,
            f"targets x{s:g}",
            ReplayConfig(policy=SHIPPED, miss_target=_targets(s)),
            shipped=s == 1,
        )
        for s in (10.0, 1.0, 0.1)
    )
    predicted = tuple(
        Knob("dynamic-predicted", f"headroom {h:g}", ReplayConfig(policy="dynamic-predicted", headroom=h))
        for h in (0.0, 0.5)
    )
    return current + agent + predicted


FRONTIER_KNOBS: tuple[Knob, ...] = _knobs()


@dataclass(frozen=True, slots=True)
class FrontierPoint:
    """One knob setting on one burst source."""

    trace: str
    knob: Knob
    cost_change_vs_static_whole: float
    cost_change_vs_static_request: float
    density_ratio_vs_static_whole: float
    pool_ratio_vs_static_whole: float
    slo_miss_share: float
    gpus_peak: int

    def to_dict(self) -> dict[str, object]:
        return {
            "trace": self.trace,
            "policy": self.knob.policy,
            "knob": self.knob.label,
            "shipped": self.knob.shipped,
            "cost_change_vs_static_whole": self.cost_change_vs_static_whole,
            "cost_change_vs_static_request": self.cost_change_vs_static_request,
            "density_ratio_vs_static_whole": self.density_ratio_vs_static_whole,
            "pool_ratio_vs_static_whole": self.pool_ratio_vs_static_whole,
            "slo_miss_share": self.slo_miss_share,
            "gpus_peak": self.gpus_peak,
        }


def frontier(traces: Mapping[str, ReplayInputs], knobs: Sequence[Knob] = FRONTIER_KNOBS) -> tuple[FrontierPoint, ...]:
    """Every knob on every burst source (``traces``: label → inputs), against that source's static baselines."""
    points: list[FrontierPoint] = []
    for label, inputs in traces.items():
        whole = run_policy(inputs, ReplayConfig(policy="static-whole"))
        request = run_policy(inputs, ReplayConfig(policy="static-request"))
        for knob in knobs:
            result = run_policy(inputs, knob.config)
            points.append(
                FrontierPoint(
                    trace=label,
                    knob=knob,
                    cost_change_vs_static_whole=result.gpu_hours / whole.gpu_hours - 1.0,
                    cost_change_vs_static_request=result.gpu_hours / request.gpu_hours - 1.0,
                    density_ratio_vs_static_whole=result.containers_per_card / whole.containers_per_card,
                    pool_ratio_vs_static_whole=result.gpus_peak / whole.gpus_peak,
                    slo_miss_share=result.slo_miss_share,
                    gpus_peak=result.gpus_peak,
                )
            )
    return tuple(points)


def format_frontier(points: Sequence[FrontierPoint]) -> str:
    lines = [
        "| burst source | policy | knob | cost vs static-whole | cost vs static-request | containers per card, "
        "× static-whole | peak pool, × static-whole | SLO misses, share of workload-s |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        knob = f"**{p.knob.label} (shipped)**" if p.knob.shipped else p.knob.label
        lines.append(
            f"| {p.trace} | {p.knob.policy} | {knob} | {p.cost_change_vs_static_whole:+.1%} "
            f"| {p.cost_change_vs_static_request:+.1%} | ×{p.density_ratio_vs_static_whole:.2f} "
            f"| ×{p.pool_ratio_vs_static_whole:.2f} ({p.gpus_peak}) | {p.slo_miss_share:.4%} |"
        )
    return "\n".join(lines)


# Drawing: the plot area in SVG user units, and the axes' ranges.
_W, _H, _LEFT, _RIGHT, _TOP, _BOTTOM = 760, 460, 70, 200, 20, 50
_X_DECADES = (-7, -1)  # misses from 1e-7 (0 is drawn here) to 1e-1 of workload-seconds
_Y_RANGE = (-1.0, 0.0)  # cost change vs static-whole
_COLOURS: Mapping[str, str] = {
    "dynamic-current-use": "#d95f02",
    "agent-default": "#1b9e77",
    "dynamic-predicted": "#7570b3",
}
_DASHES = ("", "6 4", "2 3", "8 3 2 3")  # one per burst source, in order
_SLO_LIMIT = 1e-4  # the bound: 0.01 % of workload-seconds
_COST_BOUND = -0.37  # and at least 37 % below static-whole


def _x(share: float) -> float:
    lo, hi = _X_DECADES
    decade = math.log10(share) if share > 10.0**lo else float(lo)
    return _LEFT + (min(decade, hi) - lo) / (hi - lo) * (_W - _LEFT - _RIGHT)


def _y(change: float) -> float:
    lo, hi = _Y_RANGE
    return _TOP + (hi - max(lo, min(hi, change))) / (hi - lo) * (_H - _TOP - _BOTTOM)


def frontier_svg(points: Sequence[FrontierPoint]) -> str:
    """The points as a standalone SVG document (text)."""
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect x="0" y="0" width="{_W}" height="{_H}" fill="white"/>',
    ]
    lo, hi = _X_DECADES
    for decade in range(lo, hi + 1):
        x = _x(10.0**decade)
        label = "0" if decade == lo else f"1e{decade}"
        out.append(f'<line x1="{x:.1f}" y1="{_TOP}" x2="{x:.1f}" y2="{_H - _BOTTOM}" stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{_H - _BOTTOM + 15}" text-anchor="middle">{label}</text>')
    for tenth in range(11):
        change = -tenth / 10
        y = _y(change)
        out.append(f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{_W - _RIGHT}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{change:+.0%}</text>')
    limit, bound = _x(_SLO_LIMIT), _y(_COST_BOUND)
    out.append(f'<line x1="{limit:.1f}" y1="{_TOP}" x2="{limit:.1f}" y2="{_H - _BOTTOM}" stroke="#c00" stroke-dasharray="4 3"/>')
    out.append(f'<text x="{limit + 3:.1f}" y="{_TOP + 12}" fill="#c00">SLO limit 0.01 %</text>')
    out.append(f'<line x1="{_LEFT}" y1="{bound:.1f}" x2="{_W - _RIGHT}" y2="{bound:.1f}" stroke="#c00" stroke-dasharray="4 3"/>')
    out.append(f'<text x="{_LEFT + 3}" y="{bound - 4:.1f}" fill="#c00">study: −37 %</text>')
    out.append(
        f'<text x="{(_LEFT + _W - _RIGHT) / 2:.0f}" y="{_H - 12}" text-anchor="middle">'
        "SLO misses, share of workload-seconds (log; 0 drawn at the left edge)</text>"
    )
    out.append(
        f'<text x="16" y="{(_TOP + _H - _BOTTOM) / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 16 {(_TOP + _H - _BOTTOM) / 2:.0f})">cost change vs static-whole</text>'
    )
    traces = list(dict.fromkeys(p.trace for p in points))
    legend_y = _TOP + 10
    for t_index, trace in enumerate(traces):
        dash = _DASHES[t_index % len(_DASHES)]
        for policy, colour in _COLOURS.items():
            curve = [p for p in points if p.trace == trace and p.knob.policy == policy]
            if not curve:
                continue
            path = " ".join(f"{_x(p.slo_miss_share):.1f},{_y(p.cost_change_vs_static_whole):.1f}" for p in curve)
            out.append(
                f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5" stroke-dasharray="{dash}"/>'
            )
            for p in curve:
                x, y = _x(p.slo_miss_share), _y(p.cost_change_vs_static_whole)
                title = escape(f"{trace}, {policy}, {p.knob.label}: {p.cost_change_vs_static_whole:+.1%}, "
                               f"misses {p.slo_miss_share:.4%}")
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"><title>{title}</title></circle>')
                if p.knob.shipped:
                    out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="8" fill="none" stroke="black" stroke-width="1.5"/>')
            legend_x = _W - _RIGHT + 12
            out.append(
                f'<line x1="{legend_x}" y1="{legend_y}" x2="{legend_x + 24}" y2="{legend_y}" stroke="{colour}" '
                f'stroke-width="1.5" stroke-dasharray="{dash}"/>'
            )
            out.append(f'<text x="{legend_x + 30}" y="{legend_y + 4}">{escape(policy)}, {escape(trace)}</text>')
            legend_y += 16
    legend_x = _W - _RIGHT + 12
    out.append(f'<circle cx="{legend_x + 12}" cy="{legend_y + 4}" r="8" fill="none" stroke="black" stroke-width="1.5"/>')
    out.append(f'<text x="{legend_x + 30}" y="{legend_y + 8}">shipped default</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
