"""The dashboard without a browser: its callbacks, URL state, checks and figures, called directly."""

from __future__ import annotations

import base64
import json
import re
import shlex

import numpy as np
import pytest
from dash import no_update
from hypothesis import given, settings
from hypothesis import strategies as hst

from policies import REGISTRY
from simkv import build_scenario, figures, simulate
from simkv.dashboard import callbacks, components, compute, layout, url
from simkv.dashboard import state as st
from simkv.dashboard.server import create_app
from simkv.dashboard.validation import ReportError, check_report, load_path, load_upload, parse_report

TINY = {"model": "custom", "layers": "2", "kv_heads": "8", "head_dim": "64", "prompt": "32", "decode": "300"}


def controls(**changes) -> dict:
    out = {k: st.DEFAULTS[k] for k in callbacks.SCENARIO_KEYS + ("heat",)}
    out.update(changes)
    return out


def popt_values(policy: str | None = None, **changes) -> list[str]:
    """The values of every policy parameter input, as the browser sends them (layout order)."""
    return [
        changes.get(i["field"], st.policy_defaults(i["policy"])[i["field"]]) if i["policy"] == policy
        else st.policy_defaults(i["policy"])[i["field"]]
        for i in callbacks.POPT_IDS
    ]


def errors_of(out: dict) -> dict:
    return {k: v for k, v in zip(callbacks.ERR_KEYS, out["errors"]) if v}


def card(out: dict, key: str) -> str:
    for c in out["cards"]:
        if c.id == f"card-{key}":
            return c.children[1].children
    raise KeyError(key)


def report_fixture(n_steps: int = 40) -> dict:
    """A small synthetic ``simkv validate`` result of the documented shape."""
    steps = []
    for s in range(n_steps):
        realloc = s in (0, 10, 30)
        steps.append({
            "step": s, "phase": "prefill" if s == 0 else "decode",
            "measured_rss_bytes": 100_000_000 + 40_000 * s, "measured_vmsize_bytes": 900_000_000 + 80_000 * s,
            "measured_hwm_bytes": None if s == 5 else 100_500_000 + 40_000 * s,
            "predicted_resident_bytes": 100_000_000 + 39_000 * s, "predicted_allocated_bytes": 900_000_000 + 81_000 * s,
            "predicted_peak_bytes": 100_400_000 + 39_000 * s, "latency_ms": 9.5 if realloc else 3.0, "realloc": realloc,
        })
    events = [{"step": s, "layer": layer, "tensor": t, "op": "alloc", "bytes": 65536, "status": "matched"}
              for s in (0, 10, 30) for layer in range(2) for t in ("k", "v")]
    events[-1]["status"] = "missing"
    events.append({"step": 12, "layer": None, "tensor": "past_view", "op": "alloc", "bytes": 4096, "status": "unexpected"})
    return {
        "events_total": len(events), "events_matched": len(events) - 2, "events_missing": 1, "events_unexpected": 1,
        "effective_kv_precision": "u8", "fused": True, "rise_error_pct": 0.42, "resident_slope_error_pct": -1.5,
        "scenario": {"model": "custom", "layers": 2}, "versions": {"openvino": "2026.4.1"},
        "steps": steps, "events": events,
    }


# -- URL state ---------------------------------------------------------------------------

def test_default_state_has_an_empty_query_string():
    assert url.encode(url.default_state()) == ""
    state, ignored = url.decode("")
    assert state == url.default_state() and ignored == []


text = hst.text(alphabet="0123456789abcxyz-+.,:= &?%/#", max_size=12)


@hst.composite
def states(draw):
    state = url.default_state()
    for key in draw(hst.lists(hst.sampled_from(url.CONTROLS), max_size=8, unique=True)):
        if key in url.LISTS:  # a multiple choice: its values never hold the comma that separates them
            state[key] = draw(hst.lists(hst.text(alphabet="0123456789abcxyz-+.:= &?%/#", min_size=1, max_size=8),
                                        max_size=3))
        else:
            state[key] = {"tab": hst.sampled_from(st.TABS), "ws": hst.sampled_from(url.WORKSPACES)}.get(key, text)
            state[key] = draw(state[key])
    policy = draw(hst.sampled_from(sorted(REGISTRY)))
    state["policy"] = policy
    state["popts"] = {name: draw(hst.one_of(hst.just(default), text))
                      for name, default in st.policy_defaults(policy).items()}
    return state


@settings(max_examples=150, deadline=None)
@given(states())
def test_url_round_trip_restores_every_control(state):
    search = url.encode(state)
    restored, ignored = url.decode(search)
    assert ignored == []
    assert restored == state


def test_decode_reports_what_it_cannot_use():
    state, ignored = url.decode("?policy=fixed&p.tokens=256&p.stagger=3&bogus=1&tab=nowhere&ws=kitchen")
    assert state["policy"] == "fixed" and state["popts"]["tokens"] == "256"
    assert set(ignored) == {"p.stagger", "bogus", "tab", "ws"} and state["tab"] == "memory" and state["ws"] == "session"


def test_query_string_is_readable():
    state = url.default_state()
    state.update(ops="prefill:32,decode:100,reset", policy="fixed", popts={"tokens": "256"})
    assert url.encode(state) == "?policy=fixed&ops=prefill:32,decode:100,reset&p.tokens=256"
    state.update(ws="plan", pl_devices=["a100-80gb"], pl_requests="30")
    assert url.encode(state) == ("?ws=plan&policy=fixed&ops=prefill:32,decode:100,reset&pl_requests=30"
                                 "&pl_devices=a100-80gb&p.tokens=256")


def test_the_workspace_is_in_the_url_and_old_links_open_theirs():
    """``ws`` names the open workspace; a link from before the workspaces (``?tab=serving``) opens Serving."""
    assert url.decode("?ws=plan")[0]["ws"] == "plan"
    for old in ("serving", "plan"):
        state, ignored = url.decode(f"?tab={old}&sv_requests=40")
        assert (state["ws"], state["tab"], state["sv_requests"], ignored) == (old, "memory", "40", [])
    state, _ = url.decode("?pl_devices=h100-sxm,xeon-8480")
    assert state["pl_devices"] == ["h100-sxm", "xeon-8480"]


# -- checking input -----------------------------------------------------------------------

@pytest.mark.parametrize("value, message", [
    ("", "enter a whole number"),
    ("-5", "must be at least 1"),
    ("0", "must be at least 1"),
    ("abc", "is not a number"),
    ("12.5", "is not a whole number"),
    ("nan", "is not a whole number"),
    ("1e12", "at most 1,000,000 in the dashboard"),
])
def test_bad_numbers_name_the_control(value, message):
    with pytest.raises(st.Invalid) as err:
        st.scenario_kwargs({**st.default_state(), "prompt": value})
    assert list(err.value.errors) == ["prompt"] and message in err.value.errors["prompt"]


def test_numbers_accept_separators_and_exponents():
    kwargs = st.scenario_kwargs({**st.default_state(), "prompt": "1,024", "decode": "2e3"})
    assert kwargs["prompt"] == 1024 and kwargs["decode"] == 2000


def test_every_bad_control_is_reported_at_once():
    with pytest.raises(st.Invalid) as err:
        st.scenario_kwargs({**st.default_state(), "prompt": "x", "beam": "0", "device_memory": "lots",
                            "layers": "-1", "precision": "f7"})
    assert set(err.value.errors) == {"prompt", "beam", "device_memory", "layers", "precision"}


def test_custom_model_needs_its_dimensions():
    with pytest.raises(st.Invalid) as err:
        st.scenario_kwargs({**st.default_state(), "model": "custom"})
    assert set(err.value.errors) == {"layers", "head_dim", "kv_heads"}


@pytest.mark.parametrize("changes, key, message", [
    ({"policy": "static", "prompt": "2000"}, "prompt", "does not fit max_prompt_len"),
    ({"ops": "prefill:32,decode:10,jump:3"}, "ops", "unknown operation 'jump'"),
    ({"ops": "decode:10"}, "ops", "needs a prompt first"),
    ({"heads": "30", "kv_heads": "8"}, "kv_heads", "must be a multiple of kv_heads"),
    ({"precision": "u4", "model": "custom", "layers": "2", "kv_heads": "1", "head_dim": "1"}, "precision", "whole bytes"),
    ({"beam": "4", "decode": "2"}, "beam", "at least 3 decode steps"),
    ({"device_memory": "0GiB"}, "device_memory", "must be positive"),
    ({"device_memory": "9PiB"}, "device_memory", "cannot read"),
    ({"device_memory": "2000TiB"}, "device_memory", "at most 1 PiB"),
    ({"ops": "prefill:10,decode:2000000"}, "ops", "at most 1,000,000"),
    ({"turns": "5000", "decode": "1000"}, "turns", "at most 1,000,000"),
    ({"policy": "exact", "decode": "100000"}, "decode", "ledger rows"),
])
def test_library_errors_are_shown_next_to_the_control_at_fault(changes, key, message):
    state = {**st.default_state(), **changes}
    state["popts"] = st.policy_defaults(state["policy"])
    with pytest.raises(st.Invalid) as err:
        compute.build(st.scenario_kwargs(state))
    assert key in err.value.errors and message in err.value.errors[key], err.value.errors


def test_policy_parameter_errors_name_the_parameter():
    out = callbacks.main_callback(controls(), popt_values("openvino-gpu", stagger="0"))
    assert list(errors_of(out)) == ["popt.openvino-gpu.stagger"]
    out = callbacks.main_callback(controls(), popt_values("openvino-gpu", headroom_base="many"))
    assert "is not a valid int" in errors_of(out)["popt.openvino-gpu.headroom_base"]
    out = callbacks.main_callback(controls(), popt_values("openvino-gpu", headroom_base="1e40"))
    assert "at most" in errors_of(out)["popt.openvino-gpu.headroom_base"]
    out = callbacks.main_callback(controls(policy="static", prompt="1024", decode="8000"), popt_values("static"))
    errs = errors_of(out)
    assert "min_response_len" in errs["popt.static.min_response_len"] and "decode" in errs


def test_ledger_estimate_is_high_but_close():
    for policy, decode in (("openvino-gpu", 7168), ("openvino-cpu", 7168), ("exact", 3000), ("fixed", 2000)):
        scenario = build_scenario(model="llama-3-8b", policy=policy, prompt=1024, decode=decode)
        actual = len(simulate(scenario).ledger)
        estimate = compute.estimate_ledger_rows(scenario)
        assert actual <= estimate <= 4 * actual + 1000, (policy, actual, estimate)


# -- the main callback ---------------------------------------------------------------------

def test_main_callback_default_scenario():
    out = callbacks.main_callback(controls(), popt_values("openvino-gpu"))
    assert out["store"]["ok"] and not errors_of(out)
    assert "openvino-gpu" in out["status"] and "2,049 steps" in out["status"]
    assert card(out, "peak_allocated") == "406.66 MiB"  # the README's default run
    assert card(out, "reallocations") == "795"
    names = [t.name for t in out["timeline"].data]
    assert names[:4] == ["peak in step", "allocated", "resident", "used"] and names[4].startswith("reallocation")
    # the card counts buffers replaced and says on how many steps; the markers mark those steps (the largest
    # per bucket of steps): both count 697 (the legend counted 698 steps with any K/V allocation, step 0 included)
    detail = next(c for c in out["cards"] if c.id == "card-reallocations").children[2].children
    assert detail == "K/V buffers replaced, on 697 steps"
    marks = out["timeline"].data[4]
    assert marks.name == f"reallocations on 697 steps (the largest {len(marks.x)} marked)" and 0 not in marks.x
    assert out["heatmap"].data[0].type == "heatmap"
    assert out["cli"] == "simkv run --model llama-3-8b --policy openvino-gpu --prompt 1024 --decode 2048"


def test_changing_a_policy_parameter_changes_figures_and_cards():
    before = callbacks.main_callback(controls(), popt_values("openvino-gpu"))
    after = callbacks.main_callback(controls(), popt_values("openvino-gpu", stagger="1"))
    assert "stagger=1" in after["timeline"].layout.title.text
    assert card(before, "peak_allocated") != card(after, "peak_allocated")
    assert card(after, "largest_spike") != card(before, "largest_spike")


def test_invalid_input_clears_figures_and_cards():
    out = callbacks.main_callback(controls(prompt="-5"), popt_values("openvino-gpu"))
    assert errors_of(out) == {"prompt": "must be at least 1, got -5"}
    assert out["store"] == {"ok": False} and out["status_class"] == "status invalid"
    for fig in (out["timeline"], out["heatmap"]):
        assert fig["data"] == [] and "No result" in fig["layout"]["annotations"][0]["text"]
    assert all(c.children[1].children == "—" for c in out["cards"])


def test_unexpected_failures_become_one_line(monkeypatch):
    def boom(state):
        raise RuntimeError("kaput")

    monkeypatch.setattr(compute, "main_view", boom)
    out = callbacks.main_callback(controls(), popt_values("openvino-gpu"))
    assert out["status"].startswith("Internal error (RuntimeError)") and "Traceback" not in out["status"]
    assert out["store"] == {"ok": False}


def test_out_of_memory_is_a_warning_with_the_partial_run():
    # 7.48 GiB of weights leave 327 MiB of 7.8 GiB for the KV cache: the run stops partway (it peaks at 406.66 MiB)
    out = callbacks.main_callback(controls(device_memory="7.8GiB"), popt_values("openvino-gpu"))
    assert out["store"]["ok"] and out["warning"].startswith("Out of memory: out of memory at step")
    assert out["notice"] == "" and len(out["timeline"].data) > 4  # the lines and the reallocations


def _refusal(changes: dict) -> str:
    """What the library says of a scenario it refuses before running (``""`` if it builds it)."""
    from simkv.errors import SimkvError

    try:
        compute.build(st.scenario_kwargs({**st.default_state(), **changes}))
    except st.Invalid as err:
        return err.notice
    except SimkvError as err:
        return str(err)
    return ""


@pytest.mark.parametrize("changes, why", [
    # gemma-3-27b's 25.15 GiB of weights beside 16 GiB (the "yellow banner over an empty chart")
    ({"model": "gemma-3-27b", "device_memory": "16GiB"}, "gemma-3-27b's weights (25.15 GiB) do not fit the device "
                                                         "memory (16.00 GiB)"),
    ({"device_memory": "256MiB"}, "llama-3-8b's weights (7.48 GiB) do not fit the device memory (256.00 MiB)"),
    # the weights fit, the prompt's KV does not: the first step already runs out
    ({"prompt": "100000", "decode": "10", "device_memory": "9GiB"},
     "the first step does not fit: out of memory at step 0"),
])
def test_a_run_with_no_room_at_its_first_step_says_why_and_the_fix(changes, why):
    """Nothing to draw: no figure with an out-of-memory banner over it, but one message with the fix (in the
    results area; the device memory is marked), and the cards cleared. Where the library itself refuses the
    weights before running, the message is its line, as it says (simkv.scenario); else the dashboard's own."""
    out = callbacks.main_callback(controls(**changes), popt_values("openvino-gpu"))
    assert out["store"] == {"ok": False} and out["warning"] == ""
    refused = _refusal(changes)
    if refused:
        assert out["notice"] == refused and "weights" in refused
    else:
        assert out["notice"].startswith(f"Nothing to show: {why}")
        assert re.search(r"Fix: [0-9.]+ GiB of device memory runs the whole session", out["notice"])
    # the message once, in full; the status and the device memory point at it
    assert errors_of(out) == {"device_memory": "too small for this run: see the message on the right"}
    assert out["status"] == "Nothing to show: no room on the device (why, and the fix, below)."
    assert out["timeline"]["layout"]["annotations"][0]["text"] == "No result: see the message above."
    assert all(c.children[1].children == "—" for c in out["cards"])


def test_the_librarys_refusal_of_a_model_that_does_not_fit_is_shown_as_it_says(monkeypatch):
    """Where the library refuses a model whose weights do not fit before running (one line with the fix), the
    dashboard shows that line in full, once, as it shows its own no-room notice."""
    from simkv.errors import ConfigError

    said = "gemma-3-27b: the weights (25.15 GiB) do not fit 16.00 GiB of device memory; use --device h100-sxm"

    def refuse(**kwargs):
        raise ConfigError(said)

    monkeypatch.setattr(compute, "build_scenario", refuse)
    out = callbacks.main_callback(controls(model="gemma-3-27b", prompt="7"), popt_values("openvino-gpu"))
    assert out["notice"] == said and out["status"] == compute.NO_ROOM_STATUS
    assert errors_of(out) == {"device_memory": compute.NO_ROOM_INLINE} and out["store"] == {"ok": False}


@pytest.mark.parametrize("changes, need", [
    # 100,000 prompt tokens under `fixed`: 12.27 GiB of KV at the peak with no limit, beside 7.48 GiB of weights;
    # on (7.48 + 12.27) / 0.9 = 21.95 GiB (rounded up) no buffer comes near the 90 % headroom limit. On 19.75 GiB
    # (weights + peak) the limit is reached, buffers lose their headroom, reallocate every token and the second
    # step runs out: less than the fix does not always do.
    ({"prompt": "100000", "decode": "10", "policy": "fixed", "device_memory": "9GiB"}, "21.95 GiB"),
    # gemma-3-27b: 25.15 GiB of weights fit 25.4 GiB, its first step does not; (25.15 + 1.54 GiB of KV peak) / 0.9
    ({"model": "gemma-3-27b", "device_memory": "25.4GiB"}, "29.66 GiB"),
])
def test_the_memory_a_no_room_notice_asks_for_runs_the_session(changes, need):
    """The notice's device memory is the weights plus the session's peak when nothing limits it (the session
    run again on 1 PiB), over the policy's headroom limit, rounded up: on that much the whole session runs, with
    no out-of-memory."""
    policy = changes.get("policy", "openvino-gpu")
    out = callbacks.main_callback(controls(**changes), popt_values(policy))
    assert re.search(r"Fix: ([0-9.]+ GiB) of device memory", out["notice"]).group(1) == need
    out = callbacks.main_callback(controls(**{**changes, "device_memory": need.replace(" ", "")}), popt_values(policy))
    assert out["store"]["ok"] and out["notice"] == "" and out["warning"] == ""
    almost = callbacks.main_callback(controls(**{**changes, "device_memory": "19.75GiB"}), popt_values(policy))
    if policy == "fixed":
        assert almost["warning"].startswith("Out of memory: out of memory at step 1,")


def test_an_unlimited_session_over_the_limits_gives_no_number(monkeypatch):
    """When the session run again without a memory limit would be over the dashboard's limits, the fix names
    no number rather than a wrong one."""
    real = compute.run

    def limited(kwargs):
        if kwargs["device_memory"] == str(st.MAX_DEVICE_BYTES):
            raise st.Invalid({"decode": "over the limit"})
        return real(kwargs)

    monkeypatch.setattr(compute, "run", limited)
    out = callbacks.main_callback(controls(prompt="100000", decode="10", device_memory="9GiB"), popt_values("openvino-gpu"))
    assert out["notice"].endswith("Fix: more device memory, or a smaller model, prompt or KV precision.")


def test_long_runs_are_decimated_for_display_but_keep_their_spikes():
    result = compute.run(st.scenario_kwargs({**st.default_state(), "decode": "7168"}))
    tl, _ = compute.display_figures(result)
    peak = next(t for t in tl.data if t.name == "peak in step")
    assert len(peak.x) <= compute.TIMELINE_POINTS
    assert max(peak.y) * figures.MIB == pytest.approx(result.metrics.peak_allocated_bytes)
    events = next(t for t in tl.data if t.name.startswith("reallocation"))
    assert len(events.x) <= compute.MAX_EVENTS and "largest" in events.name


def test_cli_command_reproduces_the_scenario():
    from simkv.cli import build_parser
    from simkv.flags import scenario_from_args

    for changes in ({}, {"policy": "fixed", "popts": {"tokens": "256"}, "precision": "u8", "turns": "2", "beam": "3"},
                    {**TINY, "ops": "prefill:32,decode:100,fork:4,decode:50,select:0,reset,prefill:16",
                     "device_memory": "1GiB"}):
        state = {**st.default_state(), **changes}
        state.setdefault("popts", st.policy_defaults(state["policy"]))
        kwargs = st.scenario_kwargs(state)
        args = build_parser().parse_args(shlex.split(st.cli_command(kwargs))[1:])
        assert scenario_from_args(args) == build_scenario(**kwargs)


def test_restore_leaves_controls_that_are_already_right():
    current = {k: url.DEFAULTS[k] for k in url.CONTROLS}
    popts = popt_values()
    out = callbacks.restore_callback("?prompt=512&policy=fixed&p.tokens=256", current, popts)
    changed = {k: v for k, v in out["controls"].items() if v is not no_update}
    assert changed == {"prompt": "512", "policy": "fixed"}
    new = [(i, v) for i, v in zip(callbacks.POPT_IDS, out["popts"]) if v is not no_update]
    assert new == [({"type": "popt", "policy": "fixed", "field": "tokens"}, "256")]


# -- compare, ledger table, downloads --------------------------------------------------------

def test_compare_two_policies_gives_a_delta_table():
    kwargs = st.scenario_kwargs(st.default_state())
    out = callbacks.compare_callback({"ok": True, "kwargs": kwargs}, {"cmp1_policy": "fixed"}, "allocated", "compare")
    assert out["message"] == "" and out["errors"] == ["", "", ""]
    text = str(out["table"])
    assert "peak allocated" in text and "B − A" in text
    header, body = compute.format_delta_rows(*_delta(kwargs))
    assert body[0][1] == "406.66 MiB" and body[0][2] == "756.19 MiB"  # README: fixed peaks at 756.19 MiB
    assert body[0][3].startswith("+349.53 MiB")
    assert len(out["figure"].data) == 4


def _delta(kwargs):
    view = compute.compare_view(kwargs, {**st.DEFAULTS, "cmp1_policy": "fixed"})
    return view.rows, view.labels


def test_compare_two_parameter_sets_of_one_policy_and_bad_rows():
    kwargs = st.scenario_kwargs(st.default_state())
    values = {"cmp1_policy": "openvino-gpu", "cmp1_opts": "stagger=1", "cmp2_policy": "fixed", "cmp2_opts": "tokens",
              "cmp3_policy": "static"}
    out = callbacks.compare_callback({"ok": True, "kwargs": kwargs}, values, "resident", "compare")
    assert "expected KEY=VALUE" in out["errors"][1]
    assert out["figure"]["data"] == []  # nothing compared while a row is malformed
    values["cmp2_opts"] = "tokens=64"
    out = callbacks.compare_callback({"ok": True, "kwargs": kwargs}, values, "resident", "compare")
    assert out["errors"][0] == "" and out["errors"][1] == ""
    assert "does not fit" in out["errors"][2] or "cache holds" in out["errors"][2]  # static refuses 3,072 tokens
    assert "C: fixed (tokens=64)" in str(out["table"]) and "B: openvino-gpu (stagger=1)" in str(out["table"])


def test_compare_waits_for_its_tab_and_for_a_valid_run_a():
    out = callbacks.compare_callback({"ok": True, "kwargs": {}}, {}, "allocated", "memory")
    assert out["figure"] is no_update
    out = callbacks.compare_callback({"ok": False}, {"cmp1_policy": "fixed"}, "allocated", "compare")
    assert out["figure"]["data"] == [] and "No run A" in out["message"]


def test_ledger_table_pages_sorts_and_filters_on_the_server():
    kwargs = st.scenario_kwargs(st.default_state())
    store = {"ok": True, "kwargs": kwargs}
    rows, pages, note = callbacks.table_callback(store, 0, 25, [], "")
    result = compute.run(kwargs)
    assert len(rows) == 25 and pages == -(-len(result.ledger) // 25) and "2,577 ledger rows" in note
    assert rows[0] == {"step": 0, "phase": "prefill", "request": 0, "layer": 0, "tensor": "k", "op": "alloc",
                       "bytes": 2359296, "capacity_tokens": 1152, "used_tokens": 1024, "buffer": 0}
    rows, _, note = callbacks.table_callback(store, 0, 10, [{"column_id": "bytes", "direction": "desc"}],
                                             '{op} contains "alloc" && {layer} = 3 && {step} >= 500')
    assert "match the filter" in note
    assert all(r["op"] == "alloc" and r["layer"] == 3 and r["step"] >= 500 for r in rows)
    assert [r["bytes"] for r in rows] == sorted((r["bytes"] for r in rows), reverse=True)
    rows, pages, note = callbacks.table_callback(store, 10**6, 25, [], "")
    assert rows and "page %s of" % f"{pages:,}" in note  # clamped to the last page
    rows, _, note = callbacks.table_callback(store, 0, 25, [], "{bytes} > lots")
    assert len(rows) == 25 and "filter ignored" in note
    assert callbacks.table_callback({"ok": False}, 0, 25, [], "")[0] == []


def test_ledger_csv_download_uses_the_ledger_writer():
    kwargs = st.scenario_kwargs({**st.default_state(), **TINY})
    data, note = callbacks.ledger_csv({"ok": True, "kwargs": kwargs})
    csv = base64.b64decode(data["content"]).decode() if data.get("base64") else data["content"]
    lines = csv.splitlines()
    assert lines[0] == "step,phase,request,layer,tensor,op,bytes,capacity_tokens,used_tokens,buffer"
    assert len(lines) - 1 == len(compute.run(kwargs).ledger) and data["filename"] == "simkv-ledger.csv"
    data, note = callbacks.figures_html({"ok": True, "kwargs": kwargs}, "capacity")
    assert data["content"].count("Plotly.newPlot") == 2 and "simkv run" in data["content"]
    assert callbacks.ledger_csv({"ok": False}) == (no_update, "No result to download.")


# -- validation ------------------------------------------------------------------------------

def test_validation_report_from_upload_and_path(tmp_path):
    report = report_fixture()
    path = tmp_path / "validate.json"
    path.write_text(json.dumps(report))
    upload = "data:application/json;base64," + base64.b64encode(path.read_bytes()).decode()
    assert load_upload(upload) == report == load_path(str(path))
    out = callbacks.validation_callback(None, str(path), None)
    assert out["message"] == "" and "11/13 events matched" in out["figure"].layout.title.text
    assert [r["status"] for r in out["rows"][:2]] == ["unexpected", "missing"]  # mismatches first, by step
    names = [t.name for t in out["figure"].data]
    assert "measured RSS" in names and "predicted resident" in names and "missing event (1)" in names


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r.pop("steps"), "'steps' must be a list"),
    (lambda r: r.pop("fused"), "missing 'fused'"),
    (lambda r: r.update(events_total="12"), "wrong type"),
    (lambda r: r["events"][0].update(status="maybe"), "must be matched, missing or unexpected"),
    (lambda r: r["steps"][3].pop("latency_ms"), "steps[3] lacks latency_ms"),
])
def test_malformed_reports_are_refused_with_a_reason(mutate, message):
    report = report_fixture()
    mutate(report)
    with pytest.raises(ReportError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_report(report)


def test_report_of_a_run_without_measurements_is_shown():
    report = report_fixture(5)
    report.update(rise_error_pct=None, resident_slope_error_pct=None)
    for step in report["steps"]:
        step.update(measured_rss_bytes=None, measured_vmsize_bytes=None, measured_hwm_bytes=None, latency_ms=None)
    upload = "data:application/json;base64," + base64.b64encode(json.dumps(report).encode()).decode()
    out = callbacks.validation_callback(upload, "", "r.json", "v-upload")
    assert out["message"] == "" and "rise error –" in out["figure"].layout.title.text


def test_validation_callback_shows_file_errors_inline(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    out = callbacks.validation_callback(None, str(tmp_path / "bad.json"), None)
    assert out["message"].startswith("not JSON") and out["figure"]["data"] == []
    out = callbacks.validation_callback(None, str(tmp_path / "missing.json"), None)
    assert "cannot read" in out["message"]
    out = callbacks.validation_callback(None, "/etc/passwd", None)
    assert "expected a .json file" in out["message"]
    with pytest.raises(ReportError):
        parse_report(b"[1, 2]")


# -- figures added for the dashboard --------------------------------------------------------------

def test_decimation_keeps_extremes_and_ends():
    y = np.zeros(100_000)
    y[12_345] = 7
    y[99_000] = -3
    idx = figures.decimate_indices(y, 500)
    assert len(idx) <= 500 and {0, 12_345, 99_000, 99_999} <= set(idx.tolist())
    assert np.array_equal(figures.decimate_indices(y[:300], 500), np.arange(300))
    assert np.array_equal(figures.decimate_indices(y, None), np.arange(len(y)))


def test_figures_without_display_options_are_unchanged():
    result = compute.run(st.scenario_kwargs({**st.default_state(), **TINY}))
    full = figures.timeline(result)
    assert len(full.data[0].x) == len(result.steps)
    assert [t.name for t in full.data][-1] == "reallocation"


def test_delta_table_rows():
    a = compute.run(st.scenario_kwargs({**st.default_state(), **TINY}))
    b = compute.run(st.scenario_kwargs({**st.default_state(), **TINY, "policy": "fixed"}))
    rows = figures.delta_table([a, b], ["a", "b"])
    peak = rows[0]
    assert peak["metric"] == "peak allocated" and peak["b − a"] == peak["b"] - peak["a"]
    assert peak["b vs a %"] == pytest.approx(100 * (peak["b"] - peak["a"]) / peak["a"])
    assert [r["metric"] for r in rows] == [m[1] for m in figures.DELTA_METRICS]


# -- the app --------------------------------------------------------------------------------------

def test_policy_parameters_are_generated_from_the_registry():
    from dataclasses import dataclass

    from policies import register
    from policies.base import option
    from policies.fixed import Fixed

    @dataclass(frozen=True)
    class Wide(Fixed):
        name = "wide-test"
        summary = "test policy"
        slack: int = option(7, "extra tokens for the test")

    register(Wide)
    try:
        page = str(layout.layout())
        assert "'field': 'slack'" in page and "extra tokens for the test" in page
        assert {"type": "popt", "policy": "wide-test", "field": "slack"} in components.popt_ids()
    finally:
        del REGISTRY["wide-test"]


def _ids(component, kind):
    """Pattern-matching ids of a type, in layout order (the order Dash passes ALL values in)."""
    out = []
    cid = getattr(component, "id", None)
    if isinstance(cid, dict) and cid.get("type") == kind:
        out.append(cid)
    children = getattr(component, "children", None)
    for child in children if isinstance(children, (list, tuple)) else [children]:
        if child is not None and not isinstance(child, (str, int, float)):
            out += _ids(child, kind)
    return out


def test_pattern_matching_order_matches_the_layout():
    page = layout.layout()
    assert _ids(page, "popt") == callbacks.POPT_IDS
    assert [i["key"] for i in _ids(page, "err")] == callbacks.ERR_KEYS
    assert len(callbacks.ERR_KEYS) == len(set(callbacks.ERR_KEYS))


def test_each_form_is_on_the_page_in_the_order_its_callbacks_use():
    """A Serving or Plan control is one Field: it is on the page, in the URL, and has its error line, in FIELDS'
    order (the order Dash passes the error lines in, and the callbacks return their messages in)."""
    from simkv.dashboard import plan_view as pv
    from simkv.dashboard import serving_view as sv

    page = layout.layout()
    for view, kind in ((sv, "sv-err"), (pv, "pl-err")):
        assert [i["key"] for i in _ids(page, kind)] == list(view.KEYS)
        assert set(view.KEYS) <= set(url.CONTROLS) and all(url.DEFAULTS[k] == view.DEFAULTS[k] for k in view.KEYS)
        assert len({f.key for f in view.FIELDS}) == len(view.FIELDS)


def test_app_builds_and_serves_the_page_for_a_link():
    app = create_app()
    client = app.server.test_client()
    assert client.get("/").status_code == 200
    resp = client.get("/_dash-layout", headers={"Referer": "http://localhost/?policy=fixed&p.tokens=99&prompt=7"})
    page = json.dumps(resp.get_json())
    assert '"value": "fixed"' in page and '"value": "99"' in page and '"value": "7"' in page
    assert '"data": "?policy=fixed&p.tokens=99&prompt=7"' in page


def test_simkv_app_command_line():
    from simkv.cli import build_parser

    args = build_parser().parse_args(["app"])
    assert (args.host, args.port, args.debug) == ("127.0.0.1", 8050, False)
    args = build_parser().parse_args(["app", "--host", "0.0.0.0", "--port", "9000", "--debug"])
    assert (args.host, args.port, args.debug) == ("0.0.0.0", 9000, True)


# -- the look every figure shares; computing shows progress ----------------------------------------------------

def _axes(fig) -> list:
    layout = fig.layout
    return [getattr(layout, k) for k in layout if k.startswith(("xaxis", "yaxis")) and getattr(layout, k) is not None]


def test_every_figure_of_every_workspace_has_the_same_look(tmp_path):
    """Thousands separators on every axis (log axes: 1-2-5 labels in full, so 2,000 ms reads "2,000", not "2"
    after "1000"), the legend in one row under the plot, no fixed width (the figure fills its box)."""
    from simkv.dashboard import plan_view as pv
    from simkv.dashboard import serving_view as sv
    from simkv.dashboard import tune_view as tv

    session = callbacks.main_callback(controls(), popt_values("openvino-gpu"))
    kwargs = st.scenario_kwargs(st.default_state())
    compare = callbacks.compare_callback({"ok": True, "kwargs": kwargs}, {"cmp1_policy": "fixed"}, "allocated", "compare")
    serving = sv.serving_callback({**sv.DEFAULTS, "sv_requests": "20"}, "serving")
    plan = pv.plan_callback(1, {**pv.DEFAULTS, "pl_requests": "10", "pl_max_devices": "1"})
    tune = tv.tune_callback(1, {"ok": True, "kwargs": st.scenario_kwargs({**st.default_state(), "prompt": "64",
                                                                          "model": "tinyllama-1.1b"})},
                            dict(tv.DEFAULT_FORM, tune_budget=3, tune_samples=2, tune_search="random"))
    path = tmp_path / "validate.json"
    path.write_text(json.dumps(report_fixture()))
    validation = callbacks.validation_callback(None, str(path), None)
    figs = {"timeline": session["timeline"], "heatmap": session["heatmap"], "compare": compare["figure"],
            "serving memory": serving["memory"], "serving requests": serving["requests"],
            "serving waste": serving["waste"], "plan": plan["figure"], "plan memory": plan["memory"],
            "tune": tune["figure"], "validation": validation["figure"]}
    logs = 0
    for name, fig in figs.items():
        assert fig.layout.width is None and fig.layout.height is None, name
        assert fig.layout.separators == ".," and fig.layout.legend.orientation == "h", name
        assert (fig.layout.legend.yref, fig.layout.legend.y, fig.layout.legend.yanchor) == ("container", 0, "bottom")
        for axis in _axes(fig):
            assert axis.tickformat == compute.TICKS, (name, axis)
            if axis.type == "log":
                assert axis.dtick == "D2", name
                logs += 1
    assert logs == 2  # the plan's two latency axes
    heat = figs["heatmap"].data[0]
    assert heat.colorbar.tickformat == compute.TICKS


def test_the_delta_table_has_one_column_per_run():
    """Each run's difference from A sits under its value, so four runs take five columns (not eight): the
    table fits the Compare tab at 1280 px (the browser test checks it does)."""
    kwargs = st.scenario_kwargs(st.default_state())
    values = {"cmp1_policy": "fixed", "cmp2_policy": "openvino-cpu", "cmp3_policy": "exact"}
    out = callbacks.compare_callback({"ok": True, "kwargs": kwargs}, values, "allocated", "compare")
    head, body = out["table"].children
    assert len(head.children.children) == 5
    peak = body.children[0].children
    assert peak[0].children == "peak allocated" and peak[1].children == "406.66 MiB"
    value, diff = peak[2].children
    assert value == "756.19 MiB" and diff.children == "+349.53 MiB (+85.9 %)" and "worse" in diff.className


def test_computing_disables_run_and_shows_progress():
    """Every callback that computes shows its workspace's progress bar and dims its results while it runs; the
    searches started by a Run button (Plan, Tune) disable it meanwhile, so a search is not started twice."""
    app = create_app()
    running = {}
    for spec in app._callback_list:
        if spec.get("running"):
            inputs = {f"{i['id']}.{i['property']}" for i in spec["inputs"]}
            running[spec["output"]] = (inputs, spec["running"]["running"], spec["running"]["runningOff"])

    def of(trigger):
        found = [r for r in running.values() if trigger in r[0]]
        assert len(found) >= 1, trigger
        return found

    for trigger, progress, results, button in (
        ("pl-run.n_clicks", "pl-progress", "pl-results", "pl-run"),
        ("tune-run.n_clicks", "tune-progress", "tune-results", "tune-run"),
        ("sv_requests.value", "sv-progress", "sv-results", None),
        ("prompt.value", "progress", "results", None),
    ):
        for _, on, off in of(trigger):
            assert on[f"{progress}.style"] == {} and off[f"{progress}.style"] == components.HIDDEN
            assert on[f"{results}.className"] == "results busy" and off[f"{results}.className"] == "results"
            if button:
                assert on[f"{button}.disabled"] is True and off[f"{button}.disabled"] is False


def test_the_session_s_device_is_simkv_run_s():
    """The Session workspace's device picker: the default device, an unknown one refused at its control, and the
    device (and a memory typed over its own) on the command line the page shows."""
    from simkv.cost import DEFAULT_DEVICE

    kwargs = st.scenario_kwargs(st.default_state())
    assert kwargs["device"] == DEFAULT_DEVICE and kwargs["device_memory"] is None  # the device's own memory
    assert "--device" not in st.cli_command(kwargs)
    with pytest.raises(st.Invalid) as err:
        st.scenario_kwargs({**st.default_state(), "device": "mainframe"})
    assert set(err.value.errors) == {"device"} and "choose one of" in err.value.errors["device"]
    kwargs = st.scenario_kwargs({**st.default_state(), "device": "h100-sxm", "device_memory": "60GiB"})
    assert st.cli_command(kwargs).endswith("--device h100-sxm --device-memory 60GiB")
