"""Screenshots of the dashboard's three workspaces, for the user guide (docs/guide/dashboard.md).

    python experiments/dashboard_screenshots.py [--out docs/figures] [--width 1280] [--height 800]

Serves the app in this process (as the browser tests do), opens each workspace in Debian's Chromium through
Playwright (the test extra; ``apt-get install chromium``), waits for its results (the Plan workspace's Run
pressed on a small search) and saves ``dashboard-session.png``, ``dashboard-serving.png`` and
``dashboard-plan.png``. What is shown is computed by simkv, so the pictures change only when the dashboard
or the numbers do; rerun it then.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Per workspace: its link, a Run button to press (or None), and the figure (and a text of its title) to wait for.
SHOTS = {
    "session": ("?ws=session", None, ("timeline-graph", "openvino-gpu")),
    "serving": ("?ws=serving&sv_requests=40&sv_device=h100-sxm&sv_precision=u8&sv_pool=blocks&sv_pool_size=60",
                None, ("sv-memory-graph", "memory over time")),
    "plan": ("?ws=plan&pl_requests=30&pl_max_devices=2", "#pl-run", ("pl-graph", "simkv plan")),
}
WAIT = """([id, text]) => { const gd = document.querySelector('#' + id + ' .js-plotly-plot');
                            return gd && gd.layout && gd.layout.title && (gd.layout.title.text || '').includes(text); }"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "figures")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=800)
    args = parser.parse_args()
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("Debian's chromium is not installed (apt-get install chromium)")
    if not args.out.is_dir():
        raise SystemExit(f"{args.out}: no such folder")

    from playwright.sync_api import sync_playwright
    from werkzeug.serving import make_server

    from simkv.dashboard.server import create_app

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = make_server("127.0.0.1", 0, create_app().server, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": args.width, "height": args.height})
            page.set_default_timeout(120_000)
            for name, (link, run, (graph, title)) in SHOTS.items():
                page.goto(f"http://127.0.0.1:{server.server_port}/{link}")
                page.wait_for_selector(f"#ws-{name} .sidebar .dash-dropdown")  # the controls are drawn
                if run:
                    page.click(run)
                page.wait_for_function(WAIT, arg=[graph, title])
                page.wait_for_timeout(500)  # plotly's transitions
                path = args.out / f"dashboard-{name}.png"
                page.screenshot(path=path)
                print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
            browser.close()
    finally:
        server.shutdown()
        thread.join(timeout=10)


if __name__ == "__main__":
    main()
