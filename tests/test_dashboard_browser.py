"""The dashboard end to end in headless Chromium (Debian's, driven by Playwright).

The app runs in-process on a free port (a werkzeug server in a thread, one for the module, as is the
browser); every test opens a fresh page at 1280×800 (the workspace tests also at 1920×800), fails on any
browser console error or page error, and saves a screenshot of what it checked to ``artifacts/screenshots/``.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium")
if CHROMIUM is None:
    pytest.skip("Debian's chromium is not installed (apt-get install chromium); browser tests skipped",
                allow_module_level=True)

from playwright.sync_api import expect, sync_playwright  # noqa: E402

from simkv.dashboard.server import create_app  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "artifacts" / "screenshots"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
TIMEOUT = 30_000  # ms, for anything that waits on a callback
HEIGHT = 800
expect.set_options(timeout=TIMEOUT)  # assertions wait as long as actions: a loaded 2-core machine takes seconds


@pytest.fixture(scope="module")
def server():
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    srv = make_server("127.0.0.1", 0, create_app().server, threaded=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def width():
    """The page's width in CSS pixels (a test parametrizes it to try another screen)."""
    return 1280


@pytest.fixture
def page(browser, server, width):
    """A fresh page; the test fails if the browser logs an error or a script throws."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": width, "height": HEIGHT}, accept_downloads=True)
    pg = context.new_page()
    pg.set_default_timeout(TIMEOUT)
    errors: list[str] = []
    pg.on("console", lambda msg: errors.append(f"console.{msg.type}: {msg.text}") if msg.type == "error" else None)
    pg.on("pageerror", lambda err: errors.append(f"pageerror: {err}"))
    pg.base = server
    yield pg
    context.close()
    assert errors == [], "browser errors:\n" + "\n".join(errors)


def open_app(page, query: str = "") -> None:
    page.goto(page.base + "/" + query)
    expect(page.locator("#status")).not_to_be_empty()


def popt(policy: str, field: str) -> str:
    return "[id='" + json.dumps({"field": field, "policy": policy, "type": "popt"}, separators=(",", ":")) + "']"


def err(key: str) -> str:
    return "[id='" + json.dumps({"key": key, "type": "err"}, separators=(",", ":")) + "']"


def enter(page, selector: str, value: str) -> None:
    page.fill(selector, value)
    page.press(selector, "Enter")


def card(page, key: str):
    return page.locator(f"#card-{key}-value")


def figure(page, graph: str) -> dict:
    """What plotly drew in a dcc.Graph: trace names, title, annotations."""
    return page.evaluate(
        """id => { const gd = document.querySelector('#' + id + ' .js-plotly-plot');
                   if (!gd || !gd.layout) return null;
                   return {names: (gd.data || []).map(t => t.name), points: (gd._fullData || []).map(t => (t.x || []).length),
                           title: (gd.layout.title && gd.layout.title.text) || '',
                           notes: (gd.layout.annotations || []).map(a => a.text)}; }""",
        graph,
    )


def wait_figure(page, graph: str, contains: str) -> dict:
    page.wait_for_function(
        """([id, text]) => { const gd = document.querySelector('#' + id + ' .js-plotly-plot');
                             return gd && gd.layout && gd.layout.title && (gd.layout.title.text || '').includes(text); }""",
        arg=[graph, contains],
    )
    return figure(page, graph)


def tab(page, label: str) -> None:
    page.locator("#tab .tab", has_text=label).click()


def workspace(page, label: str) -> None:
    page.locator("#ws .tab", has_text=label).click()


def test_default_scenario_loads_with_figures_and_cards(page):
    open_app(page)
    expect(card(page, "peak_allocated")).to_have_text("406.66 MiB")  # the README's default run
    expect(card(page, "reallocations")).to_have_text("795")
    fig = wait_figure(page, "timeline-graph", "openvino-gpu")
    assert fig["names"][:4] == ["peak in step", "allocated", "resident", "used"]
    assert fig["names"][4].startswith("reallocation")
    page.screenshot(path=SHOTS / "01-memory-over-steps.png")
    tab(page, "Per layer")
    heat = wait_figure(page, "heatmap-graph", "headroom per layer")
    assert heat["names"] == [None] or len(heat["names"]) == 1
    page.screenshot(path=SHOTS / "02-per-layer-stagger.png")


def test_policy_parameter_changes_figure_and_cards(page):
    open_app(page, "?tab=layers")
    expect(card(page, "peak_allocated")).to_have_text("406.66 MiB")
    enter(page, popt("openvino-gpu", "stagger"), "1")
    expect(page.locator("#status")).to_contain_text("stagger=1")
    # Without the stagger every layer reallocates on the same step (README: 756.19 MiB).
    expect(card(page, "peak_allocated")).to_have_text("756.19 MiB")
    expect(card(page, "largest_spike")).not_to_have_text("17.72 MiB")
    assert "p.stagger=1" in page.url
    wait_figure(page, "heatmap-graph", "headroom per layer")
    page.screenshot(path=SHOTS / "03-per-layer-no-stagger.png")
    tab(page, "Memory over steps")
    wait_figure(page, "timeline-graph", "stagger=1")


def test_choosing_a_policy_shows_its_own_parameters(page):
    open_app(page)
    expect(page.locator(popt("openvino-gpu", "stagger"))).to_be_visible()
    page.click("#policy")
    page.get_by_role("option", name="openvino-cpu").click()
    expect(page.locator("#status")).to_contain_text("u8 KV; policy openvino-cpu")
    expect(page.locator("#precision")).to_contain_text("policy default (u8)")
    expect(page.locator(popt("openvino-cpu", "growth"))).to_be_visible()
    expect(page.locator(popt("openvino-gpu", "stagger"))).to_be_hidden()
    fig = wait_figure(page, "timeline-graph", "policy openvino-cpu")
    # K/V reallocations (every layer's K and V grown once, on one step), not the past view's per-step blocks
    assert fig["names"][-1] == "reallocations on 1 step" and fig["points"][-1] == 1
    expect(card(page, "reallocations")).to_have_text("64")
    expect(page.locator("#card-reallocations")).to_contain_text("K/V buffers replaced, on 1 step")
    assert "policy=openvino-cpu" in page.url


def test_compare_two_policies_shows_the_delta_table(page):
    open_app(page, "?tab=compare")  # run B defaults to `fixed`
    table = page.locator("#delta")
    expect(table).to_contain_text("B − A")
    expect(table.locator("tr", has_text="peak allocated")).to_contain_text("756.19 MiB")
    fig = wait_figure(page, "compare-graph", "A: openvino-gpu")
    assert len(fig["names"]) == 4 and fig["names"][2] == "B: fixed f16: allocated"
    enter(page, "#cmp1_opts", "tokens=256")
    enter(page, "#cmp2_opts", "stagger=1")  # no policy on row C yet: ignored
    expect(table).to_contain_text("B: fixed (tokens=256) f16")
    for column in ("metric", "A: openvino-gpu f16", "B − A"):
        expect(table.locator("th", has_text=column).first).to_be_visible()
    page.screenshot(path=SHOTS / "04-compare.png")


def test_bad_input_shows_an_inline_message_and_no_stale_figure(page):
    open_app(page)
    expect(card(page, "peak_allocated")).to_have_text("406.66 MiB")
    wait_figure(page, "timeline-graph", "openvino-gpu")
    enter(page, "#prompt", "abc")
    expect(page.locator(err("prompt"))).to_have_text("'abc' is not a number")
    expect(page.locator("#status")).to_contain_text("Invalid input")
    expect(card(page, "peak_allocated")).to_have_text("—")
    fig = wait_figure(page, "timeline-graph", "no result")
    assert fig["names"] == [] and "fix the input marked in red" in fig["notes"][0]
    page.screenshot(path=SHOTS / "05-bad-input.png")
    for value, message in (("-3", "must be at least 1, got -3"), ("", "enter a whole number"),
                           ("99999999", "at most 1,000,000 in the dashboard")):
        enter(page, "#prompt", value)
        expect(page.locator(err("prompt"))).to_contain_text(message)
    enter(page, "#prompt", "512")
    expect(page.locator(err("prompt"))).to_be_empty()
    expect(card(page, "peak_allocated")).not_to_have_text("—")
    enter(page, "#device_memory", "lots")
    expect(page.locator(err("device_memory"))).to_contain_text("cannot read 'lots' as a size")
    expect(card(page, "peak_allocated")).to_have_text("—")


def test_prompt_too_long_for_static_and_unknown_ops(page):
    open_app(page, "?policy=static&prompt=2000&decode=100")
    expect(page.locator(err("prompt"))).to_contain_text("a 2000-token prompt does not fit max_prompt_len=1024")
    expect(page.locator(err("popt.static.max_prompt_len"))).to_contain_text("does not fit")
    assert figure(page, "timeline-graph")["names"] == []
    enter(page, popt("static", "max_prompt_len"), "2048")
    expect(page.locator(err("prompt"))).to_be_empty()
    expect(page.locator("#status")).to_contain_text("static (max_prompt_len=2048)")
    page.locator("#ops-details summary").click()
    enter(page, "#ops", "prefill:32,decode:10,teleport:3")
    expect(page.locator(err("ops"))).to_contain_text("unknown operation 'teleport'")
    expect(page.locator("#prompt")).to_be_disabled()  # the ops replace the simple workload fields
    page.screenshot(path=SHOTS / "06-bad-ops.png")


def test_link_restores_every_control(page):
    query = ("?model=mistral-7b&layers=16&precision=bf16&policy=fixed&prompt=512&decode=300&turns=1&turn_tokens=32"
             "&device_memory=8GiB&cmp1_policy=openvino-cpu&heat=capacity&tab=layers&p.tokens=256&p.free_old=immediate")
    open_app(page, query)
    expect(page.locator("#status")).to_contain_text("mistral-7b*: 16 layers")
    expect(page.locator("#status")).to_contain_text("bf16 KV; policy fixed (free_old=immediate, tokens=256)")
    for selector, value in (("#prompt", "512"), ("#decode", "300"), ("#turns", "1"), ("#turn_tokens", "32"),
                            ("#layers", "16"), ("#device_memory", "8GiB"), (popt("fixed", "tokens"), "256")):
        expect(page.locator(selector)).to_have_value(value)
    expect(page.locator("#model")).to_contain_text("mistral-7b")
    expect(page.locator("#policy")).to_contain_text("fixed")
    expect(page.locator("#precision")).to_contain_text("bf16")
    expect(page.locator(popt("fixed", "free_old"))).to_contain_text("immediate")
    expect(page.locator("#tab .tab--selected")).to_have_text("Per layer")
    expect(page.locator("#heat input[value=capacity]")).to_be_checked()
    wait_figure(page, "heatmap-graph", "capacity per layer")
    page.screenshot(path=SHOTS / "07-restored-from-link.png")
    enter(page, "#decode", "400")
    expect(page.locator("#status")).to_contain_text("decode:400")
    expect(page).to_have_url(re.compile(r"decode=400.*p\.tokens=256"))
    page.go_back()  # back to the link: the controls follow the URL
    expect(page.locator("#decode")).to_have_value("300")
    expect(page.locator("#status")).to_contain_text("decode:300")


def test_events_table_is_paged_on_the_server_and_downloads(page):
    open_app(page, "?tab=events")
    note = page.locator("#events-note")
    expect(note).to_contain_text("2,577 ledger rows; page 1 of 104")
    expect(page.locator("#ledger-table tbody tr")).to_have_count(27)  # header, filter row, 25 rows
    page.locator("#ledger-table button.next-page").click()
    expect(note).to_contain_text("page 2 of 104")
    cell = page.locator("#ledger-table th.dash-filter[data-dash-column=op] input[type=text]")
    cell.fill("free")
    cell.press("Enter")
    expect(note).to_contain_text("match the filter")
    expect(page.locator("#ledger-table td[data-dash-column=op]").first).to_have_text("free")
    page.screenshot(path=SHOTS / "08-events.png")
    with page.expect_download() as info:
        page.click("#dl-ledger-btn")
    lines = Path(info.value.path()).read_text().splitlines()
    assert lines[0].startswith("step,phase,request,layer,tensor,op,bytes") and len(lines) == 2578


def test_validation_tab_loads_a_report(page, tmp_path):
    from test_dashboard import report_fixture

    path = tmp_path / "validate.json"
    path.write_text(json.dumps(report_fixture(200)))
    open_app(page, "?tab=validation")
    page.locator("#v-upload input[type=file]").set_input_files(str(path))
    expect(page.locator("#card-v_matched-value")).to_have_text("11 / 13")
    expect(page.locator("#card-v_precision-value")).to_have_text("u8")
    fig = wait_figure(page, "v-graph", "11/13 events matched")
    assert "measured RSS" in fig["names"] and "predicted resident" in fig["names"]
    expect(page.locator("#v-table")).to_contain_text("unexpected")
    page.screenshot(path=SHOTS / "09-validation.png", full_page=True)
    enter(page, "#vpath", str(tmp_path / "nowhere.json"))
    expect(page.locator("#v-message")).to_contain_text("cannot read")
    assert figure(page, "v-graph")["names"] == []


# --- the Tune view (simkv/dashboard/tune_view.py) ---------------------------------------------------


def test_tune_tab_runs_and_a_click_opens_the_point(page):
    open_app(page, "?model=tinyllama-1.1b&prompt=64")
    tab(page, "Tune")
    for key, value in (("tune_budget", "4"), ("tune_samples", "3")):
        page.fill(f"#{key}", value)
    page.click("#tune-run")
    fig = wait_figure(page, "tune-graph", "simkv tune: openvino-gpu over 3 workloads")
    assert "defaults" in fig["names"] and "Pareto front" in fig["names"]
    expect(page.locator("#tune-table")).to_contain_text("defaults")
    first = page.locator("#tune-table td[data-dash-column='headroom_base']").first.inner_text()
    # Click the first Pareto point where plotly drew it.
    box = page.evaluate("""() => { const gd = document.querySelector('#tune-graph .js-plotly-plot');
        const i = gd.data.findIndex(t => t.name === 'Pareto front');
        const pt = gd.querySelectorAll('.scatterlayer .trace')[i].querySelector('.point').getBoundingClientRect();
        return {x: pt.x + pt.width / 2, y: pt.y + pt.height / 2}; }""")
    page.mouse.click(box["x"], box["y"])
    expect(page.locator(popt("openvino-gpu", "headroom_base"))).to_have_value(first)
    expect(page.locator("#tab .tab--selected")).to_have_text("Memory over steps")
    page.screenshot(path=str(SHOTS / "tune.png"))


# --- the Serving view (simkv/dashboard/serving_view.py) ---------------------------------------------------


def test_serving_tab_runs_and_follows_its_inputs(page):
    # the device and the KV precision given, so the numbers below do not move with the defaults
    open_app(page, "?sv_requests=40&sv_device=h100-sxm&sv_precision=u8")
    workspace(page, "Serving")
    expect(page).to_have_url(re.compile(r"ws=serving"))
    fig = wait_figure(page, "sv-memory-graph", "memory over time: paged, 40 requests")
    assert {"allocated", "used (tokens)"} <= set(fig["names"]) and "pool (dynamic" in " ".join(fig["names"])
    assert wait_figure(page, "sv-requests-graph", "requests: arrival")["names"][:2] == [
        "arrival → first token", "first token → finish"]
    wait_figure(page, "sv-waste-graph", "waste:")
    expect(page.locator("#sv-latency-table")).to_contain_text("e2e")
    expect(page.locator("#card-sv_finished-value")).to_have_text("40 / 40")
    expect(page.locator("#sv-status")).to_contain_text("first 40 requests of the Azure conversation trace")
    # A fixed pool too small for the load: the pool is drawn, requests are preempted and ignored.
    page.click("#sv_pool")
    page.get_by_role("option", name="num_kv_blocks").click()
    enter(page, "#sv_pool_size", "60")
    fig = wait_figure(page, "sv-memory-graph", "memory over time: paged, 40 requests")
    page.wait_for_function("""() => { const gd = document.querySelector('#sv-memory-graph .js-plotly-plot');
        return gd && gd.data.some(t => t.name === 'pool (fixed, 60 blocks)'); }""")
    # 5 prompts longer than the pool, and request 14 (389 tokens), waiting beside 13 (2,221) when a step scheduled nothing: GenAI then
    # marks every waiting request IGNORED (the H100 preset's bf16 weights make the steps slower than its int8 did).
    expect(page.locator("#card-sv_finished-value")).to_have_text("34 / 40")
    names = figure(page, "sv-requests-graph")["names"]
    assert "preempted (6)" in names and "ignored / rejected (6)" in names
    expect(page).to_have_url(re.compile(r"sv_pool_size=60"))
    page.locator("#sv-requests-graph").scroll_into_view_if_needed()
    page.screenshot(path=str(SHOTS / "serving.png"))
    enter(page, "#sv_requests", "abc")
    expect(page.locator("[id='" + json.dumps({"key": "sv_requests", "type": "sv-err"}, separators=(",", ":")) + "']")
           ).to_have_text("'abc' is not a number")
    wait_figure(page, "sv-memory-graph", "no result")
    expect(page.locator("#sv-status")).to_have_text("Invalid input: requests — see the message in red on the left.")


# --- the workspaces: each shows only its own controls, fits the screen, and is drawn ------------------------

#: Per workspace: its link, a control only it has, and what shows it is done (a figure whose title has a text).
WORKSPACES = {
    "session": ("?ws=session", "#model", ("timeline-graph", "openvino-gpu")),
    "serving": ("?ws=serving&sv_requests=40", "#sv_model", ("sv-memory-graph", "memory over time")),
    # a small search (4 deployments x 20 requests), run with the Run button
    "plan": ("?ws=plan&pl_requests=20&pl_max_devices=1", "#pl_model", ("pl-graph", "simkv plan")),
}

#: Every visible control (input, button, select) that is not in the open workspace (nor the header).
STRAY_CONTROLS = """ws => Array.from(document.querySelectorAll('input, button, select, textarea')).filter(c => {
    const r = c.getBoundingClientRect(), style = getComputedStyle(c);
    if (r.width === 0 || r.height === 0 || style.visibility === 'hidden' || c.closest('.header')) return false;
    const home = c.closest('.workspace');
    return !home || home.id !== 'ws-' + ws;
}).map(c => c.id || c.className || c.tagName)"""

#: Horizontal overflow: the page's, and any workspace column's (whose own overflow is hidden, so it would be cut).
OVERFLOW = """() => { const doc = document.scrollingElement;
    const cols = Array.from(document.querySelectorAll('.workspace .main, .workspace .sidebar'))
        .filter(e => e.getBoundingClientRect().width > 0);
    return {page: [doc.scrollWidth, doc.clientWidth],
            columns: cols.filter(e => e.scrollWidth > e.clientWidth).map(e => [e.parentNode.id, e.className, e.scrollWidth, e.clientWidth]),
            scrolled: cols.filter(e => e.scrollLeft !== 0).length}; }"""

#: A PNG's size and how many distinct colours it has (decoded by the browser: no image library needed here).
PNG_FACTS = """async b64 => { const img = new Image(); img.src = 'data:image/png;base64,' + b64; await img.decode();
    const c = document.createElement('canvas'); c.width = img.width; c.height = img.height;
    const ctx = c.getContext('2d'); ctx.drawImage(img, 0, 0);
    const px = new Uint32Array(ctx.getImageData(0, 0, c.width, c.height).data.buffer);
    return {width: img.width, height: img.height, colours: new Set(px).size}; }"""


def check_screenshot(page, name: str, width: int) -> None:
    """A screenshot of the viewport, saved, of the page's size and not blank (a drawn page has hundreds of
    colours: text, figures, anti-aliasing; a blank or single-colour one has a handful)."""
    import base64

    png = page.screenshot(path=SHOTS / name)
    facts = page.evaluate(PNG_FACTS, base64.b64encode(png).decode())
    assert (facts["width"], facts["height"]) == (width, HEIGHT), facts
    assert facts["colours"] > 200, facts


@pytest.mark.parametrize("width", [1280, 1920])
@pytest.mark.parametrize("ws", list(WORKSPACES))
def test_each_workspace_shows_only_its_own_controls_and_fits_the_screen(page, ws, width):
    link, own, (graph, title) = WORKSPACES[ws]
    page.goto(page.base + "/" + link)
    expect(page.locator("#ws .tab--selected")).to_have_text(ws.capitalize())
    expect(page.locator(own)).to_be_visible()
    if ws == "plan":
        page.click("#pl-run")
    wait_figure(page, graph, title)
    for other, (_, their, _) in WORKSPACES.items():
        if other != ws:
            expect(page.locator(their)).to_be_hidden()
    assert page.evaluate(STRAY_CONTROLS, ws) == []
    overflow = page.evaluate(OVERFLOW)
    assert overflow["page"][0] == overflow["page"][1] == width and overflow["columns"] == [], overflow
    assert overflow["scrolled"] == 0
    check_screenshot(page, f"workspace-{ws}-{width}.png", width)


def test_switching_workspaces_keeps_each_ones_state_and_the_url(page):
    open_app(page, "?prompt=512")
    workspace(page, "Plan")
    expect(page).to_have_url(re.compile(r"\?ws=plan&prompt=512$"))
    expect(page.locator("#pl_model")).to_be_visible()
    expect(page.locator("#model")).to_be_hidden()
    enter(page, "#pl_requests", "30")
    expect(page).to_have_url(re.compile(r"pl_requests=30"))
    workspace(page, "Session")
    expect(page.locator("#prompt")).to_have_value("512")
    expect(page.locator("#pl_requests")).to_be_hidden()
    expect(page).to_have_url(re.compile(r"\?prompt=512&pl_requests=30$"))  # the Session is the default: no ws
    page.go_back()  # back: the Plan workspace as it was
    expect(page.locator("#ws .tab--selected")).to_have_text("Plan")
    expect(page.locator("#pl_requests")).to_have_value("30")


def test_picking_a_compare_policy_keeps_the_page_in_place(page):
    """The issue: picking a policy in Compare scrolled the page sideways and cut the left column. With four runs
    (the widest table) and a long label, the table fits and nothing scrolls sideways."""
    open_app(page, "?tab=compare&cmp1_opts=tokens=256,free_old=immediate&cmp2_policy=openvino-cpu")
    expect(page.locator("#delta")).to_contain_text("C − A")
    page.click("#cmp3_policy")
    page.get_by_role("option", name="exact", exact=True).click()
    table = page.locator("#delta")
    expect(table).to_contain_text("D: exact f16")
    expect(table).to_contain_text("B: fixed (free_old=immediate, tokens=256) f16")
    overflow = page.evaluate(OVERFLOW)
    assert overflow["page"] == [1280, 1280] and overflow["columns"] == [] and overflow["scrolled"] == 0, overflow
    assert page.evaluate("() => document.querySelector('#sidebar').getBoundingClientRect().left") == 0
    fits = page.evaluate("() => { const d = document.querySelector('.delta'); return d.scrollWidth <= d.clientWidth; }")
    assert fits
    check_screenshot(page, "compare-four-runs.png", 1280)


def test_the_reallocation_legend_and_card_count_the_same_steps(page):
    """The issue: a legend said "reallocation (largest 467 of 698 steps)" beside a card saying 795. The card
    counts buffers replaced and says on how many steps; the legend marks those steps: both say 697."""
    open_app(page)
    expect(card(page, "reallocations")).to_have_text("795")
    expect(page.locator("#card-reallocations")).to_contain_text("K/V buffers replaced, on 697 steps")
    names = wait_figure(page, "timeline-graph", "openvino-gpu")["names"]
    assert re.fullmatch(r"reallocations on 697 steps \(the largest \d+ marked\)", names[4]), names


def test_a_model_whose_weights_do_not_fit_says_so_with_the_fix(page):
    open_app(page, "?model=gemma-3-27b&device_memory=16GiB")
    notice = page.locator("#notice")  # the library's refusal, or the dashboard's notice: both name the weights
    expect(notice).to_contain_text("gemma-3-27b's weights")
    expect(notice).to_contain_text("16.00 GiB")
    expect(page.locator("#warning")).to_be_hidden()
    assert figure(page, "timeline-graph")["names"] == []
    check_screenshot(page, "weights-do-not-fit.png", 1280)


def test_the_session_runs_on_the_device_picked(page):
    """The Session workspace's device (as ``simkv run --device``: its memory, the precision its runtime loads the
    weights in). gemma-3-27b's int8 weights (25.15 GiB) leave no room on arc-a770's 16 GiB: the library's refusal
    names the fix; picking h100-sxm (79.18 GiB, the checkpoint's bf16) runs it, and the command line and the link
    carry the device."""
    open_app(page, "?model=gemma-3-27b&device=arc-a770")
    expect(page.locator("#notice")).to_contain_text("no less than arc-a770's 16.00 GiB")
    page.click("#device")
    page.get_by_role("option", name="h100-sxm").click()
    expect(page.locator("#notice")).to_be_hidden()
    wait_figure(page, "timeline-graph", "gemma-3-27b")
    expect(page.locator("#cli")).to_contain_text("--model gemma-3-27b")
    expect(page.locator("#cli")).to_contain_text("--device h100-sxm")
    assert "device=h100-sxm" in page.url
