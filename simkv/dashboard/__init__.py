"""The interactive what-if dashboard (Dash): ``python app.py`` or ``simkv app``. Three workspaces, one per
question: Session (one session's KV memory under a policy), Serving (a stream of requests on one device),
Plan (the cheapest deployment that meets an SLO).

* :mod:`simkv.dashboard.state` — the Session workspace's control values, limits and checks;
* :mod:`simkv.dashboard.compute` — checks, cached runs and views as data, the figures' common look (no Dash);
* :mod:`simkv.dashboard.validation` — reading ``simkv validate`` reports;
* :mod:`simkv.dashboard.components` — the controls, forms (:class:`~simkv.dashboard.components.Field`),
  graphs, tables, cards and progress bar every workspace is built from;
* :mod:`simkv.dashboard.tune_view` — the Session's Tune tab (``simkv tune`` on the sidebar's scenario);
* :mod:`simkv.dashboard.serving_view` — the Serving workspace (``simkv run --trace/--synthetic`` on its form);
* :mod:`simkv.dashboard.plan_view` — the Plan workspace (``simkv plan`` on its form, run when asked);
* :mod:`simkv.dashboard.url` — the page's address: the open workspace and every control;
* :mod:`simkv.dashboard.layout` — the page; :mod:`simkv.dashboard.callbacks` — the Session's wiring and the URL's;
* :mod:`simkv.dashboard.server` — the app (page and callbacks wired) and its ``--host``/``--port`` flags.

Each module imports only those listed before it.
"""
