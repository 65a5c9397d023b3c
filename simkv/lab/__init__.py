"""The policy lab: sweeps, the tuner and the helpers the experiments share.

* :mod:`simkv.lab.sweep` — parameter grids × workloads → one Parquet row per point, resumable,
  on local processes or a Dask cluster;
* :mod:`simkv.lab.tune` — search a policy's parameters over a workload distribution, Pareto front;
* :mod:`simkv.lab.traces` — workload distributions drawn from request traces;
* :mod:`simkv.lab.palette` — one colour per policy in every figure;
* :mod:`simkv.lab.output` — figures (HTML, PNG, SVG) and CSVs written the same way by every experiment.
"""
