"""The dashboard's Plan view: what `simkv plan` finds for the same inputs, its command line parsed by the CLI's
own parser, bounded, and never a traceback."""

from __future__ import annotations

import json
import logging
import shlex
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from simkv.dashboard import plan_view as pv
from simkv.lab import plan

#: 40 synthetic requests at 10/s on A100s: one device misses ttft_p99 1 s (about 1.05 s), two meet it; the
#: cheapest (two replicas round-robin, 256 batched tokens) is served again with a line per replica.
TWO_REPLICAS = {"pl_traffic": "synthetic", "pl_requests": "40", "pl_rate": "10", "pl_devices": ["a100-80gb"],
                "pl_max_devices": "2", "pl_slo": "ttft_p99=1s"}


def form(**over) -> dict:
    return {**pv.DEFAULT_FORM, **over}


def test_the_view_shows_what_the_library_finds():
    view = pv.plan_view(form(**TWO_REPLICAS))
    assert view["ok"], view["status"]
    target = plan.Target({"requests": 40, "rate": 10.0, "arrivals": "poisson", "prompt_dist": "lognormal:1024:1.0",
                          "output_dist": "lognormal:200:1.0", "seed": 0}, "llama-3.1-8b", plan.parse_slo("ttft_p99=1s"))
    lib = plan.run_plan(target, plan.Space(("a100-80gb",), max_devices=2), workers=1)
    rec = lib.recommended
    assert (rec["devices"], rec["tp"], rec["replicas"], rec["router"]) == (2, 1, 2, "round-robin")
    # the table: every deployment in search order, with the library's status and latency (ms, to 0.1)
    assert [(r["devices"], r["tp"], r["replicas"], r["router"], r["batched tokens"], r["status"]) for r in view["rows"]] == [
        (r["devices"], r["tp"], r["replicas"], r["router"], r["max_num_batched_tokens"], r["status"]) for r in lib.rows]
    assert [r["ttft_p99 (ms)"] for r in view["rows"]] == [round(r["ttft_p99_s"] * 1000, 1) for r in lib.rows]
    assert [r["note"] for r in view["rows"]].count(pv.RECOMMENDED) == 1
    assert view["rows"][[r is rec for r in lib.rows].index(True)]["note"] == pv.RECOMMENDED
    # the recommendation in words, with both command lines
    text = view["recommended"]
    assert text["text"] == "Recommended: " + plan.describe(rec)
    assert text["detail"] == f"cost 2 device-hours per hour; ttft_p99 {rec['ttft_p99_s'] * 1000:.1f} ms (limit 1 s)"
    assert text["run"] == plan.command(rec) and text["plan"] == view["cli"]
    assert view["status"].startswith("searched 8 deployments of a100-80gb (at most 2 devices each): 8 run, 6 meet")
    # the Pareto figure is plan_figure's
    names = [t.name for t in view["figure"].data]
    assert "Pareto front" in names and "recommended" in names and "a100-80gb" in names
    # memory over time: one line per replica in each panel, each the whole of that replica's run
    from simkv.serving import serve

    served = serve(plan.spec_of(rec))
    lines = [t for t in view["memory"].data if t.yaxis in ("y", None)]
    assert [t.name for t in lines] == [f"replica {k} ({len(r.spec.requests)} requests)" for k, r in enumerate(served.replicas)]
    for t, rep in zip(lines, served.replicas):
        assert list(t.x) == list(rep.steps["time_s"])
        assert np.allclose(t.y, rep.steps["allocated_bytes"] / 2**30)
    assert len(view["memory"].data) == 2 * len(served.replicas)


def test_no_deployment_meets_the_slo():
    out = pv.plan_callback(1, form(pl_traffic="synthetic", pl_requests="20", pl_rate="10", pl_devices=["a100-80gb"],
                                   pl_max_devices="1", pl_slo="ttft_p99=1ms"))
    assert out["status_class"] == "status" and "0 meet the SLO" in out["status"]
    assert "No deployment searched meets the SLO" in str(out["recommended"])
    assert out["memory"]["layout"]["annotations"][0]["text"].startswith("No deployment meets the SLO")
    assert {r["status"] for r in out["rows"]} <= {"slo", "slo-guard"} and out["rows"]


def test_the_memory_figure_thins_long_runs():
    """A line of more steps than MEMORY_POINTS keeps, per bucket of steps, the highest value: the peak survives."""
    t = np.arange(10_000, dtype=float)
    y = np.zeros(10_000)
    y[7_777] = 5.0
    x, v = pv._thin(t, y, 100)
    assert len(x) == 100 and v.max() == 5.0 and 7_777.0 in x


@pytest.mark.parametrize("over", [
    {},
    {"pl_traffic": "code", "pl_requests": "7", "pl_max_devices": "1", "pl_devices": ["xeon-8480"]},
    {"pl_traffic": "synthetic", "pl_requests": "30", "pl_rate": "0.3333333333333333", "pl_model": "qwen3-8b",
     "pl_slo": " e2e_p90 = 30s , tpot_p50=40ms ", "pl_prices": "a100-80gb=$2.21, h100-sxm=4.25"},
], ids=["default", "code-trace", "synthetic-priced"])
def test_the_plan_line_builds_the_same_search(over):
    """The shown `simkv plan` line, parsed by the CLI's own parser, describes exactly the search the view runs."""
    from simkv.cli import build_parser
    from simkv.commands.plan import target_from_args

    i = pv.inputs(form(**over))
    words = shlex.split(i.line)
    assert words[:2] == ["simkv", "plan"]
    args = build_parser().parse_args(words[1:])
    target, space, prices = target_from_args(args)
    if "trace" in target.workload:  # the line names a shipped trace (simkv.shipped.TRACES), as the search does
        assert target.workload["trace"] in {p for p, _ in pv.TRACES.values()}
    assert target == i.target and space == i.space and prices == i.prices
    assert target.key() == i.target.key()


@pytest.mark.parametrize("over, message", [
    ({"pl_slo": "ttft_p99=fast"}, "SLO: ttft_p99: 'fast' is not a duration with a unit"),
    ({"pl_slo": ""}, "SLO: needs at least one target"),
    ({"pl_slo": "latency_p99=1s"}, "SLO: 'latency_p99=1s' is not METRIC_pQ=LIMIT"),
    ({"pl_requests": "5000"}, "requests: at most 500 in the dashboard"),
    ({"pl_requests": "abc"}, "requests: 'abc' is not a number"),
    ({"pl_requests": "0"}, "requests: must be at least 1"),
    ({"pl_traffic": "synthetic", "pl_rate": "-2"}, "rate (requests/s): must be a finite number above 0"),
    ({"pl_traffic": "synthetic", "pl_rate": "inf"}, "rate (requests/s): must be a finite number above 0"),
    ({"pl_devices": []}, "devices: choose at least one device"),
    ({"pl_devices": ["mainframe"]}, "devices: unknown device 'mainframe'"),
    ({"pl_max_devices": "9"}, "max devices: at most 8 in the dashboard"),
    ({"pl_prices": "h100-sxm=3"}, "prices ($/h): gives no price for a100-80gb"),
    ({"pl_prices": "h100-sxm=free,a100-80gb=2"}, "prices ($/h): expects DEVICE=DOLLARS_PER_HOUR"),
    ({"pl_model": "no-such-model"}, "model: choose a preset model"),
])
def test_bad_input_is_one_line(over, message):
    """A bad field's message is shown once, next to the field, as the form is typed (no Run needed); Run then
    says only which field is wrong (the issue: a bad SLO's error was shown twice)."""
    label, _, text = message.partition(": ")
    key = next(k for k, v in pv.LABELS.items() if v == label)
    live = pv.live(form(**over))
    assert live["cli"] == "" and live["work"] == "" and list(live["errors"]) == [key] and text in live["errors"][key]
    out = pv.plan_callback(1, form(**over))
    assert out["status"] == f"Invalid input: {label} — see the message in red on the left."
    assert out["status_class"] == "status invalid" and text not in out["status"]
    assert out["rows"] == [] and out["recommended"] == []
    assert out["figure"]["layout"]["annotations"][0]["text"] == "No plan: see the message above."


def test_over_the_work_limit_says_why_and_how_to_run_it():
    line = ("simkv plan --trace azure-conv --limit 500 --model llama-3.1-8b --slo "
            "ttft_p99=2s,tpot_p99=50ms --devices h100-sxm,a100-80gb --max-devices 8")
    message = ("104 deployments to search × 500 requests = 52,000 requests to serve: at most 12,000 in the "
               "dashboard; fewer requests, devices or max devices")
    # before Run: the line (to run it in full) and the message next to the requests
    assert pv.live(form(pl_requests="500", pl_max_devices="8")) == {"cli": line, "errors": {"pl_requests": message},
                                                                     "work": ""}
    out = pv.plan_callback(1, form(pl_requests="500", pl_max_devices="8"))
    assert out["status"] == ("Over the dashboard's limits: requests — see the message in red on the left. "
                             f"Run it with: {line}")


def test_an_unexpected_error_is_one_line(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom\nwith a traceback")

    monkeypatch.setattr(plan, "run_plan", broken)
    out = pv.plan_callback(1, form(pl_requests="3"))
    assert out["status"] == "Internal error (RuntimeError); the server log has the details."


def test_the_default_form_runs_and_its_line_is_shown():
    live = pv.live(form())
    assert live == {"cli": ("simkv plan --trace azure-conv --limit 100 --model "
                            "llama-3.1-8b --slo ttft_p99=2s,tpot_p99=50ms --devices h100-sxm,a100-80gb "
                            "--max-devices 4"),
                    "errors": {}, "work": "Searching 44 deployments × 100 requests (fewer once one meets the SLO)…"}
    out = pv.plan_callback(1, form())
    assert out["status_class"] == "status" and out["status"].startswith("searched 44 deployments")
    shown = str(out["recommended"])
    assert "Recommended: 1 x h100-sxm" in shown and live["cli"] in shown
    assert "simkv run --trace azure-conv --limit 100 " in shown


def test_the_table_fits_the_page_and_says_once_what_every_deployment_shares():
    """Columns holding one value for every deployment leave the table for a line above it, so the table fits a
    1280 px page with its reason column read in full (the issue: the reason column was cut)."""
    view = pv.plan_view(form())
    ids = [c["id"] for c in view["columns"]]
    assert view["shared"] == "every deployment: scheduler vllm, KV bf16, block 16, pool 0.9"
    assert {"scheduler", "KV", "block", "pool"}.isdisjoint(ids) and ids[-1] == "reason"
    assert all((r["KV"], r["block"], r["pool"]) == ("bf16", 16, "0.9") for r in view["rows"])  # the rows keep them
    assert ids == ["note", "status", "devices", "device", "tp", "replicas", "router", "batched tokens", "cost",
                   "ttft_p99 (ms)", "tpot_p99 (ms)", "reason"]
    # a CPU and a GPU: two KV precisions, block sizes and pools, so those columns are back; one device each, so
    # no router (its column goes, and "-" is not worth a word)
    view = pv.plan_view(form(pl_requests="10", pl_max_devices="1", pl_devices=["xeon-8480", "h100-sxm"]))
    assert {"scheduler", "KV", "block", "pool"} <= {c["id"] for c in view["columns"]} and view["shared"] == ""
    assert [(r["device"], r["scheduler"]) for r in view["rows"][:3:2]] == [("xeon-8480", "continuous"),
                                                                           ("h100-sxm", "vllm")]
    assert "router" not in {c["id"] for c in view["columns"]}


# --- in the browser (the pattern of tests/test_dashboard_browser.py: Debian's Chromium driven by Playwright) ---

CHROMIUM = shutil.which("chromium")
TIMEOUT = 20_000  # ms, for anything that waits on a callback (a loaded 2-core machine takes seconds)
SHOTS = Path(__file__).resolve().parent.parent / "artifacts" / "screenshots"


@pytest.fixture(scope="module")
def app_page():
    """A page of the dashboard served in-process; the test fails on any browser console error or page error."""
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium); browser tests skipped")
    from playwright.sync_api import expect, sync_playwright
    from werkzeug.serving import make_server

    from simkv.dashboard.server import create_app

    expect.set_options(timeout=TIMEOUT)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    srv = make_server("127.0.0.1", 0, create_app().server, threaded=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    SHOTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    try:
        with sync_playwright() as p:
            chromium = p.chromium.launch(executable_path=CHROMIUM, args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run"])
            context = chromium.new_context(viewport={"width": 1280, "height": 800})
            page = context.new_page()
            page.set_default_timeout(TIMEOUT)
            page.on("console", lambda msg: errors.append(f"console.{msg.type}: {msg.text}") if msg.type == "error" else None)
            page.on("pageerror", lambda err: errors.append(f"pageerror: {err}"))
            page.base = f"http://127.0.0.1:{srv.server_port}"
            yield page, expect
            context.close()
            chromium.close()
    finally:
        srv.shutdown()
        thread.join(timeout=10)
    assert errors == [], "browser errors:\n" + "\n".join(errors)


def _enter(page, selector: str, value: str) -> None:
    page.fill(selector, value)
    page.press(selector, "Enter")


def _wait_figure(page, graph: str, contains: str) -> list[str]:
    """The trace names of a dcc.Graph once its title contains ``contains``."""
    page.wait_for_function(
        """([id, text]) => { const gd = document.querySelector('#' + id + ' .js-plotly-plot');
                             return gd && gd.layout && gd.layout.title && (gd.layout.title.text || '').includes(text); }""",
        arg=[graph, contains])
    return page.evaluate("id => document.querySelector('#' + id + ' .js-plotly-plot').data.map(t => t.name)", graph)


@pytest.mark.browser
def test_plan_workspace_runs_and_shows_the_recommendation(app_page):
    page, expect = app_page
    page.goto(page.base + "/?ws=plan")
    expect(page.locator("#ws .tab--selected")).to_have_text("Plan")
    cli = page.locator("#pl-cli")
    expect(cli).to_contain_text("simkv plan --trace azure-conv --limit 100")
    _enter(page, "#pl_requests", "30")
    _enter(page, "#pl_max_devices", "2")
    expect(cli).to_contain_text("--limit 30 ")
    expect(cli).to_contain_text("--max-devices 2")
    # while it searches: Run disabled, a progress bar saying how much work it is. A fast machine finishes the
    # search between two polls, so the page itself records what it showed (no race with the search's speed).
    page.evaluate("""() => {
        window.__busy = {progress: false, disabled: false};
        const bar = document.querySelector('#pl-progress'), run = document.querySelector('#pl-run');
        new MutationObserver(() => {
            if (getComputedStyle(bar).display !== 'none') window.__busy.progress = true;
            if (run.disabled) window.__busy.disabled = true;
        }).observe(document.body, {attributes: true, subtree: true, attributeFilter: ['style', 'disabled']});
    }""")
    expect(page.locator("#pl-progress")).to_contain_text("Searching 16 deployments × 30 requests")
    page.click("#pl-run")
    expect(page.locator("#pl-rec-text")).to_contain_text("Recommended: 1 x h100-sxm, vLLM scheduler, tp 1, 1 replica")
    expect(page.locator("#pl-run")).to_be_enabled()
    expect(page.locator("#pl-progress")).to_be_hidden()
    assert page.evaluate("() => window.__busy") == {"progress": True, "disabled": True}
    expect(page.locator("#pl-rec-detail")).to_contain_text("ttft_p99")
    expect(page.locator("#pl-rec-plan")).to_have_text(cli.inner_text())
    expect(page.locator("#pl-rec-run")).to_contain_text("simkv run --trace azure-conv --limit 30")
    expect(page.locator("#pl-status")).to_contain_text("searched 16 deployments of h100-sxm, a100-80gb")
    assert {"h100-sxm", "Pareto front", "recommended"} <= set(_wait_figure(page, "pl-graph", "simkv plan: llama-3.1-8b"))
    assert _wait_figure(page, "pl-memory-graph", "memory over time, 1 replica") == ["replica 0", "replica 0"]
    # the log latency axis labels every tick in full: 1,000 then 2,000 (not "2")
    ticks = page.evaluate("() => Array.from(document.querySelectorAll('#pl-graph .ytick text')).map(t => t.textContent)")
    assert "2,000" in ticks and "2" not in ticks, ticks
    table = page.locator("#pl-table")
    expect(table).to_contain_text(pv.RECOMMENDED)
    expect(table).to_contain_text("pruned")
    # the reason column is read in full: the table is no wider than its box
    assert page.evaluate("""() => { const t = document.querySelector('#pl-table .dash-spreadsheet-container');
                                    return t.scrollWidth <= t.clientWidth; }""")
    page.screenshot(path=str(SHOTS / "plan.png"))
    page.locator("#pl-notes").scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "plan-memory-and-table.png"))
    # a bad SLO: one message, next to the SLO, as it is typed; Run then names the field, without repeating it
    _enter(page, "#pl_slo", "ttft_p99=fast")
    slo_err = page.locator("[id='" + json.dumps({"key": "pl_slo", "type": "pl-err"}, separators=(",", ":")) + "']")
    expect(slo_err).to_have_text("ttft_p99: 'fast' is not a duration with a unit (e.g. 2s, 50ms)")
    expect(cli).to_be_empty()
    page.click("#pl-run")
    expect(page.locator("#pl-status")).to_have_text("Invalid input: SLO — see the message in red on the left.")
    _wait_figure(page, "pl-graph", "no result")
    expect(page.locator("#pl-recommended")).to_be_empty()
