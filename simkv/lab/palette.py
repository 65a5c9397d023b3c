"""One colour per policy, the same in every figure of the lab, the experiments and the dashboard.

Colours are plotly's default qualitative sequence (D3 Category10), assigned to
the built-in policies in registry order; a policy registered later gets the
next free colour from a fixed extension list, by name, so it too is stable.
The timeline's own colours (simkv.figures.COLORS: allocated blue, used green …)
describe quantities, not policies, and are not used here for policies.
"""

from __future__ import annotations

import hashlib

POLICY_COLORS = {
    "openvino-gpu": "#1f77b4",
    "openvino-cpu": "#ff7f0e",
    "fixed": "#d62728",
    "geometric": "#9467bd",
    "exact": "#8c564b",
    "static": "#e377c2",
    "paged": "#2ca02c",
    "max-length": "#7f7f7f",
}
_EXTRA = ("#17becf", "#bcbd22", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd")
#: Baseline and recommendation markers in the tuner's figures.
BASELINE_COLOR = "#000000"
OTHER_COLOR = "#c7c7c7"


def policy_color(name: str) -> str:
    """The colour of a policy by name (a label such as ``"fixed +128"`` takes its first word's)."""
    key = name.split(" ")[0]
    if key in POLICY_COLORS:
        return POLICY_COLORS[key]
    return _EXTRA[int(hashlib.sha1(key.encode()).hexdigest(), 16) % len(_EXTRA)]


__all__ = ["POLICY_COLORS", "BASELINE_COLOR", "OTHER_COLOR", "policy_color"]
