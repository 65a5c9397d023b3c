"""The dashboard's Tune view: the same results as simkv.lab.tune, bounded, and clickable into the what-if view."""

from __future__ import annotations

import json

import pytest
from dash import no_update

from simkv.dashboard import state as st
from simkv.dashboard import tune_view
from simkv.lab import traces, tune

FORM = dict(tune_view.DEFAULT_FORM, tune_budget=4, tune_samples=3, tune_search="random", tune_seed=2)


def kwargs(**over):
    state = {**st.default_state(), "model": "tinyllama-1.1b", "prompt": "64", **over}
    return st.scenario_kwargs(state)


def test_tune_view_matches_the_library():
    view = tune_view.tune_view(kwargs(), FORM)
    _, decodes = traces.sample(traces.AZURE_CONV, 3, 2)
    spec = tune.TuneSpec(base=kwargs(), params=[tune.Param.parse(p, "openvino-gpu") for p in tune.TUNABLE["openvino-gpu"]],
                         workloads=[(64, int(d)) for d in decodes], search="random", budget=4, seed=2)
    lib = tune.run_tune(spec, workers=1)
    assert [r["headroom_base"] for r in view["rows"][:-1]] == [
        c.params.get("headroom_base") for c in lib.pareto]
    assert view["rows"][-1]["note"] == "defaults"
    assert view["rows"][-1]["headroom_base"] == 128 and view["rows"][-1]["stagger"] == 64
    # Every plotted point carries its parameters for the click into the what-if view.
    assert all(json.loads(cd) is not None for trace in view["figure"].data for cd in trace.customdata)


@pytest.mark.parametrize("form, over, message", [
    ({"tune_budget": 5000, "tune_samples": 64}, {}, "the dashboard runs at most"),
    ({"tune_samples": 0}, {}, "samples must be in"),
    ({"tune_params": "nonsense=1"}, {}, "not an option of policy openvino-gpu"),
    ({"tune_objectives": []}, {}, "at least one --objective"),
    ({}, {"ops": "prefill:8,decode:8"}, "clear the explicit operations"),
])
def test_tune_view_errors_are_one_line(form, over, message):
    out = tune_view.tune_callback(1, {"ok": True, "kwargs": kwargs(**over)}, {**FORM, **form})
    assert message in out["status"] and out["status"].startswith("Cannot tune:") and out["rows"] == []


def test_tune_view_needs_a_valid_scenario():
    out = tune_view.tune_callback(1, {"ok": False}, FORM)
    assert out["status"] == "Cannot tune: fix the scenario on the left first"


def test_clicking_a_point_sets_the_policy_inputs_and_opens_the_what_if_view():
    ids = [{"type": "popt", "policy": "openvino-gpu", "field": "headroom_base"},
           {"type": "popt", "policy": "openvino-gpu", "field": "stagger"},
           {"type": "popt", "policy": "fixed", "field": "tokens"}]
    click = {"points": [{"customdata": json.dumps({"headroom_base": 304})}]}
    out = tune_view.open_point(click, "openvino-gpu", ids)
    # headroom_base from the point; stagger back to the default (the point does not set it); other policies untouched.
    assert out == {"popts": ["304", "64", no_update], "tab": "memory"}
    assert tune_view.open_point({"points": []}, "openvino-gpu", ids)["tab"] is no_update



def test_a_few_far_configurations_do_not_squash_the_front():
    """The issue's case: a front between 0 and 25 reallocations, the defaults at 60, two configurations at 310
    and 460: the y axis spans 0 to about 90 (the front, the defaults, half their span again), the x axis is
    left to plotly (its points do not stretch it), and a note counts the two beyond."""
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_scatter(x=[230, 240, 250], y=[25, 5, 0], name="Pareto front")
    fig.add_scatter(x=[227], y=[60], name="defaults")
    fig.add_scatter(x=[235, 253, 240, 244], y=[310, 460, 30, 27], name="other feasible")
    assert tune_view.focus_axes(fig) == 2
    assert fig.layout.yaxis.range == (-3.0, 90.0) and fig.layout.xaxis.range is None
    assert fig.layout.annotations[0].text == "2 configurations beyond these axes: double-click to see all"
    # nothing far: the axes are plotly's own
    fig = go.Figure()
    fig.add_scatter(x=[230, 240], y=[25, 5], name="Pareto front")
    fig.add_scatter(x=[235], y=[30], name="other feasible")
    assert tune_view.focus_axes(fig) == 0 and fig.layout.yaxis.range is None and not fig.layout.annotations


def test_the_progress_line_says_how_much_work_run_starts():
    assert tune_view.work_text(kwargs(), FORM) == ("Searching 4 configurations and the defaults × 3 workloads = "
                                                  "15 simulations…")
    assert tune_view.work_text(None, FORM) == "Searching…"


def test_the_tune_tab_shows_the_simkv_tune_line_it_runs_on_the_picked_device():
    """The Tune tab's line carries the sidebar's device; parsed by `simkv tune`'s own parser it is the same session
    (the device's memory and its runtime's weights), and run it prints the dashboard's front and defaults."""
    import os
    import shlex
    import subprocess
    import sys
    from pathlib import Path

    from simkv.cli import build_parser
    from simkv.flags import scenario_from_args
    from simkv.lab import sweep

    picked = kwargs(device="h100-sxm")
    line = tune_view.tune_command(picked, FORM)
    assert line == ("simkv tune --model tinyllama-1.1b --policy openvino-gpu --prompt 64 --device h100-sxm "
                    "--trace azure-conv --samples 3 --objective peak:max --objective reallocs:mean --search random "
                    "--budget 4 --seed 2")
    assert "--device xeon-8480" in tune_view.tune_command(kwargs(), FORM)  # the default device, said too
    assert "--decode 16 --device" in tune_view.tune_command(kwargs(decode="16"), {**FORM, "tune_workloads": "scenario"})
    assert tune_view.tune_command(None, FORM) == ""
    args = build_parser().parse_args(shlex.split(line)[1:])
    spec, _, _ = tune_view.tune_spec(picked, FORM)
    cli, dash = scenario_from_args(args), sweep.scenario_of(spec.base)
    assert (cli.device_memory, cli.weights_memory) == (dash.device_memory, dash.weights_memory)
    assert dash.device_memory == tune_view.tune_spec(kwargs(device="h100-sxm"), FORM)[0].free_bytes + dash.weights_memory
    assert dash.device_memory != sweep.scenario_of(tune_view.tune_spec(kwargs(), FORM)[0].base).device_memory
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-m", "simkv.cli", *shlex.split(line)[1:], "--workers", "1", "--json"],
                         capture_output=True, text=True, cwd=root, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    view = tune_view.tune_view(picked, FORM)
    peak = tune.Objective.parse("peak:max")
    assert [r["peak:max"] for r in view["rows"]] == [peak.show(c["objectives"]["peak:max"])
                                                     for c in result["pareto"] + [result["baseline"]]]
    assert "--device h100-sxm" in result["command"]
