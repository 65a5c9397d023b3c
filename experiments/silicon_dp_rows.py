"""The silicon rows simkv refuses for attention data parallelism, counted (docs/research/vllm-dp.md §1).

For each row with ``attention_dp_size`` > 1, or ``moe_tp_size x moe_ep_size`` > ``tp_size``: its file, model,
precision, vLLM release, layout columns and measured date, counted; and a check of the columns' convention — the
client's total ``silicon_concurrency`` (in ``silicon_data_source``) is ``batch_size x attention_dp_size``.

    PYTHONPATH=. python experiments/silicon_dp_rows.py
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from simkv.validate.silicon import read_rows

SILICON = Path(__file__).parent / "data" / "silicon"


def main() -> None:
    counts: Counter = Counter()
    checked = mismatched = 0
    for system in ("h100", "h200", "b200", "b300"):
        for r in read_rows(SILICON / f"{system}_sxm_vllm_agg.csv"):
            if r.attention_dp <= 1 and r.moe_tp * r.moe_ep <= r.tp:
                continue
            measured = re.search(r"measured=([\d-]+)", r.source)
            counts[(system, r.model_path, r.precision or "bf16", r.backend_version,
                    f"tp {r.tp} / dp {r.attention_dp} / moe_tp {r.moe_tp} / moe_ep {r.moe_ep}",
                    measured.group(1) if measured else "-")] += 1
            total = re.search(r"silicon_concurrency=(\d+)", r.source)
            if r.attention_dp > 1 and total:
                checked += 1
                mismatched += int(total.group(1)) != r.concurrency * r.attention_dp
    for key, n in sorted(counts.items()):
        print(f"{n:4d}  " + "  ".join(key))
    print(f"{sum(counts.values())} rows; silicon_concurrency == batch_size x attention_dp_size on "
          f"{checked - mismatched} of {checked} attention-DP rows")


if __name__ == "__main__":
    main()
