"""The interactive what-if dashboard (Dash): ``python app.py`` or ``simkv app``.

* :mod:`simkv.dashboard.state` — control values, limits, the URL form of a what-if;
* :mod:`simkv.dashboard.compute` — checks, cached runs and views as data (no Dash);
* :mod:`simkv.dashboard.validation` — reading ``simkv validate`` reports;
* :mod:`simkv.dashboard.components` — the controls, graphs, tables and cards every view is built from;
* :mod:`simkv.dashboard.tune_view` — the Tune view (``simkv tune`` on the sidebar's scenario);
* :mod:`simkv.dashboard.serving_view` — the Serving view (``simkv run --trace/--synthetic`` on its own form);
* :mod:`simkv.dashboard.plan_view` — the Plan view (``simkv plan`` on its own form, run when asked);
* :mod:`simkv.dashboard.layout` — the page; :mod:`simkv.dashboard.callbacks` — the main view's wiring;
* :mod:`simkv.dashboard.server` — the app (page and callbacks wired) and its ``--host``/``--port`` flags.

Each module imports only those listed before it.
"""
