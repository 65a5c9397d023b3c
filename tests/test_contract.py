"""The command line's contract (simkv/flags.py, docs/guide/cli.md), walked over every command's parser.

* Every flag is used by the mode it is given in, or refused in one line naming the mode it belongs to: each
  command's parser is introspected (argparse), each flag given alone in each mode the command declares.
* Every output path is checked before any work: an existing folder and a suffix of the format its flag writes,
  nothing created — not a folder, not a file.
* The flags a mode declares do shape its run (``simkv run``: each changes the scenario or the serving spec).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from simkv import flags
from simkv.cli import build_parser
from simkv.flags import ANY, flag_modes
from conftest import default_sigint

ROOT = Path(__file__).resolve().parent.parent


def simkv(*args, cwd=ROOT, check=False, timeout=300):
    return subprocess.run([sys.executable, "-m", "simkv.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, check=check, env={**os.environ, "PYTHONPATH": str(ROOT)})


def commands() -> dict[str, flags.Parser]:
    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


PARSERS = commands()


def parse(parser: flags.Parser, argv: list[str]) -> tuple[int, str]:
    """(0, "") if the parser accepts ``argv``, else (its exit code, what it printed on stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            return exc.code, err.getvalue()
    return 0, ""


def namespace(parser: flags.Parser, argv: list[str]) -> argparse.Namespace:
    """The namespace ``argv`` gives, without the contract (to see which modes it selects)."""
    saved = flags.check_contract
    flags.check_contract = lambda parser, args: None
    try:
        return parser.parse_args(argv)
    finally:
        flags.check_contract = saved


def sample(action, tmp: Path) -> list[list[str]]:
    """Values to give a flag with (a path where it writes one: in a folder that exists)."""
    if action.nargs == 0:
        return [[]]
    if action.dest == "requests" and callable(action.modes):  # simkv run --requests N|PATH: both kinds
        return [["5"], [str(tmp / "r.csv")]]
    if getattr(action, "output", None):
        return [[str(tmp / ("out" + (action.output[0] or "")))]]
    if action.choices:  # each: a choice may select a mode (--runtime vllm)
        return [[str(c)] for c in action.choices]
    if action.type is int or callable(action.type) and action.type is not float:  # tune --samples N|all
        return [["2"]]
    if action.type is float:
        return [["1.5"]]
    return [["x"]]


#: What a command requires on every line (``simkv sweep``: a grid and its output).
REQUIRED = {"sweep": ["--param", "decode=10,20", "--out", str(Path(tempfile.gettempdir()) / "simkv-contract.parquet")]}


def examples(parser: flags.Parser) -> list[list[str]]:
    """A command line selecting each of the command's modes (the bare command first)."""
    required = REQUIRED.get(parser.prog.split()[-1], [])
    return [required] + [required + list(m.example) for m in parser.modes if m.example]


def test_every_flag_of_a_command_with_modes_declares_them():
    with_modes = [name for name, p in PARSERS.items() if p.modes]
    assert {"run", "validate", "tune", "sweep", "plan"} <= set(with_modes)
    for name in with_modes:
        parser = PARSERS[name]
        flags.check_declarations(parser)  # raises TypeError naming a flag without modes
        assert all(getattr(a, "modes", None) is not None for a in parser.flags()), name


def test_a_flag_declared_without_its_mode_fails_the_parse():
    parser = flags.Parser(prog="simkv x", modes=flags.EXECUTOR_MODES)
    parser.add_argument("--new-flag")
    with pytest.raises(TypeError, match="--new-flag declares no mode"):
        parser.parse_args([])


def allowed(action, value, active: set[str]) -> bool:
    wanted = set(flag_modes(action, value if isinstance(value, str) else None))
    return ANY in wanted or bool(wanted & active)


@pytest.mark.parametrize("command", sorted(n for n, p in PARSERS.items() if p.modes))
def test_each_flag_alone_in_a_mode_that_does_not_use_it_is_refused(command, tmp_path):
    """Every flag, given alone on top of each mode's command line: accepted exactly where one of its modes is
    selected, else exit 2 with one line naming the flag and the mode it belongs to. Every flag that is not for
    every mode is refused somewhere among the modes (none is silently ignored there)."""
    parser = PARSERS[command]
    refused_somewhere = set()
    for action in parser.flags():
        for value in sample(action, tmp_path):
            for base in examples(parser):
                argv = base + [action.option_strings[0], *value]
                args = namespace(parser, argv)
                active = {m.name for m in parser.modes if m.active(args)}
                if not all(allowed(a, v, active) for a, uses in parser.given.items() if a is not action
                           for _, v in uses):
                    continue  # the flag changed the base's mode under one of the base's own flags
                wanted = set(flag_modes(action, value[0] if value else None))
                code, err = parse(parser, argv)
                if ANY in wanted or wanted & active:
                    assert code == 0, (argv, err)
                else:
                    lines = err.strip().splitlines()
                    assert code == 2 and len(lines) == 1, (argv, err)
                    says = [m.says for m in parser.modes if m.name in wanted]
                    assert f"{action.option_strings[0]} applies to " in lines[0] and says[0] in lines[0], lines[0]
                    refused_somewhere.add(action.option_strings[0])
    assert not list(tmp_path.iterdir())  # nothing written by parsing
    bare = examples(parser)[0]
    for action in parser.flags():
        flag = action.option_strings[0]
        if callable(action.modes) or ANY in flag_modes(action) or flag in refused_somewhere:
            continue
        # never refused: only a flag that selects its own mode (--trace, --synthetic, --serving, --paged ...)
        wanted = set(flag_modes(action))
        before = {m.name for m in parser.modes if m.active(namespace(parser, bare))}
        after = {m.name for m in parser.modes
                 if m.active(namespace(parser, bare + [flag, *sample(action, tmp_path)[0]]))}
        assert wanted & after and not wanted & before, f"{flag} is refused in none of {command}'s modes"


@pytest.mark.parametrize("argv, flag, mode", [
    # a single session (the issue's list): serving flags are refused, not ignored
    (["--requests", "5"], "--requests", "synthetic requests"),
    (["--steps", "s.csv"], "--steps", "serving"),
    (["--replicas", "2"], "--replicas", "serving"),
    (["--scheduler", "static"], "--scheduler", "serving"),
    (["--rate", "2"], "--rate", "synthetic requests"),
    (["--limit", "3"], "--limit", "a trace"),
    (["--block-size", "16"], "--block-size", "paged memory"),
    (["--tp", "2"], "--tp", "serving"),
    # serving: a session's lengths, a policy under paged memory, beams
    (["--synthetic", "--prompt", "50", "--decode", "10"], "--prompt", "a single session"),
    (["--synthetic", "--decode", "10"], "--decode", "a single session"),
    (["--synthetic", "--policy", "fixed"], "--policy", "contiguous memory"),
    (["--synthetic", "--beam", "4"], "--beam", "a single session"),
    (["--trace", "azure-code", "--rate", "3"], "--rate", "synthetic requests"),
    (["--synthetic", "--memory", "contiguous", "--block-size", "16"], "--block-size", "paged memory"),
    (["--synthetic", "--memory", "contiguous", "--engine", "reference"], "--engine", "paged memory"),
    (["--synthetic", "--router", "least-kv"], "--router", "replicas"),
])
def test_the_flags_a_new_user_tripped_over_are_refused_in_one_line(argv, flag, mode, tmp_path):
    out = simkv("run", *argv, cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and out.stdout == "" and len(lines) == 1, out.stderr
    assert lines[0].startswith(f"simkv run: error: {flag} applies to ") and mode in lines[0], lines[0]
    assert not list(tmp_path.iterdir())


# -- output paths --------------------------------------------------------------------------------------------


def output_flags():
    """(command, flag action, a base command line whose modes use it) for every output path of every command."""
    out = []
    for name, parser in PARSERS.items():
        for action in parser.flags():
            if not getattr(action, "output", None):
                continue
            for base in examples(parser):
                args = namespace(parser, base + [action.option_strings[0], "x.json"])
                active = {m.name for m in parser.modes if m.active(args)}
                wanted = set(flag_modes(action, "x.json")) if parser.modes else {ANY}
                if ANY in wanted or wanted & active:
                    out.append((name, action, base))
                    break
    return out


OUTPUTS = output_flags()


def test_every_command_s_output_paths_are_declared():
    named = {(c, a.option_strings[0]) for c, a, _ in OUTPUTS}
    assert named == {("run", "--ledger"), ("run", "--timeline"), ("run", "--requests"), ("run", "--steps"),
                     ("validate", "--out"), ("validate", "--report"), ("sweep", "--out"), ("tune", "--figure"),
                     ("tune", "--out"), ("plan", "--out"), ("plan", "--figure"), ("calibrate", "--out")}


@pytest.mark.parametrize("command, action, base", OUTPUTS, ids=[f"{c}{a.option_strings[0]}" for c, a, _ in OUTPUTS])
def test_an_output_path_is_checked_before_anything_runs_and_nothing_is_created(command, action, base, tmp_path):
    parser = PARSERS[command]
    flag, good = action.option_strings[0], next(s for s in action.output if s)
    wrong = ".txt" if good != ".txt" else ".csv"
    for path, says in ((tmp_path / "no" / "such" / "dir" / f"f{good}", "does not exist (none is created)"),
                       (Path("/simkv-no-such-dir") / f"f{good}", "does not exist (none is created)"),
                       (tmp_path / f"f{wrong}", "the file name must end in"),
                       (tmp_path, "must end in" if "" not in action.output else "is a directory")):
        code, err = parse(parser, base + [flag, str(path)])
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and f"{flag} {path}" in lines[0] and says in lines[0], err
    assert not list(tmp_path.iterdir()) and not Path("/simkv-no-such-dir").exists()
    assert parse(parser, base + [flag, str(tmp_path / f"f{good}")]) == (0, "")


def test_two_outputs_may_not_name_one_file(tmp_path):
    out = simkv("run", "--synthetic", "--requests", "3", "--steps", "t.csv", "--requests", "t.csv", cwd=tmp_path)
    assert out.returncode == 2 and "both write t.csv" in out.stderr and not list(tmp_path.iterdir())


def test_the_issue_s_paths_are_refused_and_nothing_is_made(tmp_path):
    for args, says in ((["run", "--synthetic", "--requests", "3", "--steps", "no/such/dir/s.csv"], "directory no/such/dir"),
                       (["run", "--synthetic", "--requests", "3", "--requests", "/nope/r.csv"], "directory /nope"),
                       (["tune", "--figure", "nodir/f.png"], "directory nodir"),
                       (["run", "--synthetic", "--steps", "s.txt"], "must end in .csv or .parquet")):
        out = simkv(*args, cwd=tmp_path)
        assert out.returncode == 2 and says in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not list(tmp_path.iterdir()) and not Path("/nope").exists()


def test_a_parquet_name_writes_parquet(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    out = simkv("run", "--synthetic", "--requests", "4", "--steps", "s.parquet", "--requests", "r.parquet",
                "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    steps, requests = pq.read_table(tmp_path / "s.parquet"), pq.read_table(tmp_path / "r.parquet")
    data = json.loads(out.stdout)
    assert steps.num_rows == data["steps"] and requests.num_rows == 4
    assert steps.column_names[:3] == ["step", "time_s", "requests"] and requests.column_names[0] == "id"
    # the same rows as the CSV
    assert simkv("run", "--synthetic", "--requests", "4", "--steps", "s.csv", cwd=tmp_path).returncode == 0
    csv_rows = (tmp_path / "s.csv").read_text().splitlines()
    assert len(csv_rows) == steps.num_rows + 1 and csv_rows[1].split(",")[0] == str(steps.column("step")[0].as_py())


# -- the flags a mode declares shape its run ---------------------------------------------------------------

#: A value unlike the default for each flag of ``simkv run`` that shapes the run (a second where a mode's command
#: line gives the first).
RUN_VALUES = {
    "--model": ["qwen2.5-0.5b"], "--layers": ["4"], "--heads": ["16"], "--kv-heads": ["4"], "--head-dim": ["64"],
    "--sliding-window": ["512"], "--precision": ["f32"], "--prompt": ["64"], "--decode": ["32"], "--turns": ["2"],
    "--turn-tokens": ["8"], "--turn-decode": ["4"], "--turn-divergence": ["4"], "--beam": ["2"], "--ops": ["prefill:16,decode:2"],
    "--policy": ["fixed"], "--policy-opt": ["stagger=7"], "--device-memory": ["64GiB"], "--weights-memory": ["1GiB"],
    "--weights-precision": ["f16"], "--device": ["h100-sxm"], "--requests": ["7"], "--rate": ["2.5"],
    "--arrivals": ["fixed"], "--prompt-dist": ["fixed:64"], "--output-dist": ["fixed:8"], "--seed": ["3"],
    "--limit": ["5"], "--scheduler": ["static", "sequential"], "--memory": ["contiguous", "paged"], "--block-size": ["8"], "--gpu-memory-utilization": ["0.8"],
    "--scheduling-policy": ["priority"], "--long-prefill-token-threshold": ["64"],
    "--num-kv-blocks": ["1000"], "--cache-size": ["2.0"], "--max-num-seqs": ["4"], "--max-num-batched-tokens": ["512"],
    "--no-dynamic-split-fuse": [], "--prefix-caching": [], "--kv-manager": ["vllm"], "--on-oom": ["wait"],
    "--concurrency": ["2", "3"], "--async-scheduling": [], "--cache-eviction": ["on"], "--static-batch": ["3"], "--max-context": ["4096"], "--strict-context": [], "--replicas": ["2", "3"],
    "--router": ["least-kv", "session"], "--workers": ["2"], "--tp": ["2"], "--engine": ["reference"],
}
#: Flags that shape what is written or selected, not the run: outputs, the mode selectors, --pp (always refused).
NOT_THE_RUN = {"--json", "--ledger", "--timeline", "--steps", "--trace", "--synthetic", "--pp"}


def test_every_flag_of_simkv_run_shapes_the_runs_of_its_modes():
    """In each mode a flag declares, giving it changes what runs: the single session's scenario (and engine), or
    the serving spec (``--requests PATH`` aside: an output)."""
    from simkv.flags import scenario_from_args
    from simkv.serving.cli import spec_from_args

    parser = PARSERS["run"]
    checked = set()
    for action in parser.flags():
        flag = action.option_strings[0]
        if flag in NOT_THE_RUN:
            continue
        for base in examples(parser):
            values = RUN_VALUES[flag]
            value = values[1:] if values and flag in base and base[base.index(flag) + 1] == values[0] else values[:1]
            extra = ["--device", "h100-sxm"] if flag == "--tp" else []  # the default device (OpenVINO) has no tp
            args0, args1 = namespace(parser, base + extra), namespace(parser, base + extra + [flag, *value])
            active = {m.name for m in parser.modes if m.active(args1)}
            if not (ANY in flag_modes(action, value[0] if value else None)
                    or set(flag_modes(action, value[0] if value else None)) & active):
                continue
            if "session" in active:
                run0, run1 = (scenario_from_args(args0), args0.engine), (scenario_from_args(args1), args1.engine)
            else:
                run0, run1 = spec_from_args(args0), spec_from_args(args1)
            assert run0 != run1, (base, flag)
            checked.add(flag)
    assert checked == {a.option_strings[0] for a in parser.flags()} - NOT_THE_RUN


# -- exit codes --------------------------------------------------------------------------------------------


def test_ctrl_c_exits_130_with_one_line():
    proc = subprocess.Popen([sys.executable, "-m", "simkv.cli", "run", "--engine", "reference", "--decode", "5000000",
                             "--weights-memory", "0", "--json"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint, env={**os.environ, "PYTHONPATH": str(ROOT)})
    time.sleep(4)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip() == "simkv run: interrupted" and out == "", err


def test_calibrate_without_openvino_gives_the_install_hint(monkeypatch, capsys):
    from simkv.cli import main

    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` raises ImportError
    assert main(["calibrate"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "simkv calibrate: error: calibrating this host needs OpenVINO: pip install 'simkv[openvino]'"


# -- what a command prints ----------------------------------------------------------------------------------


def test_cost_is_bounded_and_warns_of_what_no_device_holds():
    out = simkv("cost", "--context", "1000000000000")
    assert out.returncode == 2 and out.stderr.strip() == (
        "simkv cost: error: --context must be an integer in 0..100,000,000, got 1000000000000")
    # deepseek-v3 at bf16 on one H100: 1,249.88 GiB of weights, priced with a warning. No fix fits one preset: no
    # device holds them, an eighth (--tp 8: 156 GiB) passes 79.18 GiB, and int4 (312 GiB) too: only simkv plan
    out = simkv("cost", "--model", "deepseek-v3", "--device", "h100-sxm", "--json")
    assert out.returncode == 0
    warning = ("1,249.88 GiB of bf16 weights + 68.69 MiB of KV do not fit h100-sxm's 79.18 GiB: priced as if they did "
               "(size a deployment with simkv plan)")
    assert out.stderr.strip() == f"simkv cost: warning: {warning}" and json.loads(out.stdout)["warnings"] == [warning]
    out = simkv("cost", "--context", "100000")
    assert "100,001 tokens per sequence are past llama-3-8b's context of 8,192" in out.stderr
    assert simkv("cost").stderr == ""  # the default step fits: no word


def test_deepseek_v3_is_listed_by_the_latent_it_caches():
    line = next(ln for ln in simkv("models").stdout.splitlines() if ln.startswith("deepseek-v3 "))
    # 61 layers x one latent of 512 + 64 values x 2 B (f16) = 70,272 B = 68.62 KiB per token
    assert line.split() == ["deepseek-v3", "61", "128", "1", "latent", "512+64", "68.62", "KiB"]
    assert 61 * (512 + 64) * 2 == 70_272 and f"{70_272 / 1024:.2f}" == "68.62"


def test_sizes_have_thousands_separators():
    from simkv.units import format_bytes

    assert format_bytes(3344.63 * 2**30) == "3,344.63 GiB" and format_bytes(1019.22 * 2**20) == "1,019.22 MiB"
    assert format_bytes(512) == "512 B" and format_bytes(1.5 * 2**30) == "1.50 GiB"


def test_a_clipped_reason_ends_between_words():
    from simkv.lab.plan import _clip

    reason = ("device xeon-8480 runs OpenVINO, which has no tensor parallelism to model here: its GPU plugin has none "
              "(multi-GPU is HETERO pipeline parallelism) and the CPU plugin's socket split (model_distribution_policy "
              "TENSOR_PARALLEL) splits the weights of one socket's cores")
    clipped = _clip(reason, 200)
    assert len(clipped) <= 200 and clipped.endswith(" …")
    kept = clipped[:-2]
    assert reason.startswith(kept) and reason[len(kept)] in " ,;:(" and not kept.endswith((",", ";", ":", "("))
    assert _clip("short", 200) == "short"


def test_the_reproduce_line_rounds_the_pool_and_reproduces_the_run():
    """A GenAI-scheduled deployment's pool, a fraction of the device less the weights, in GiB: shortened to the
    fewest decimals that keep its blocks — the same run."""
    from dataclasses import replace

    from simkv.cost import get_device
    from simkv.lab import plan
    from simkv.serving import serve
    from simkv.serving.engine.core import PagedServing
    from simkv.serving.kv.groups import paged_kv

    row = {"workload": json.dumps({"trace": "azure-code", "limit": 50}),
           "model": "llama-3.1-8b", "device": "h100-sxm", "precision": "bf16", "block_size": 16, "pool": "0.9",
           "max_num_batched_tokens": 256, "tp": 1, "replicas": 1, "router": "-", "max_num_seqs": 256,
           "dynamic_split_fuse": True, "prefix_caching": False, "kv_manager": "genai", "memory": "paged",
           "policy": "openvino-cpu", "max_context": None, "scheduler": "continuous"}  # --serving-scheduler continuous
    exact = plan._device_share(row)[3]
    line = plan.command(row)
    shown = line.split("--cache-size ")[1].split()[0]
    # 0.9 x h100-sxm's 85,017,493,504 B (71.2608 GiB) less llama-3.1-8b's 14.9570 GiB of bf16 weights
    assert exact == pytest.approx(0.9 * 85_017_493_504 / 2**30 - 14.95703125, abs=1e-9)
    assert exact == pytest.approx(56.3038, abs=1e-4) and shown == "56.304" and repr(exact) != shown
    spec = plan.spec_of(row)
    budget = get_device(row["device"]).memory_bytes - spec.weights_bytes
    kv = paged_kv(spec.device_model, spec.precision, 16, "genai")
    assert (PagedServing._pool_sizes(spec.paged, kv, budget)
            == PagedServing._pool_sizes(replace(spec.paged, cache_size=float(shown)), kv, budget))
    out = json.loads(simkv(*line.split()[1:], "--json").stdout)
    assert out["steps"] == serve(spec).metrics["steps"] and out["ttft_p99_s"] == serve(spec).metrics["ttft_p99_s"]


def test_figures_of_tune_and_plan_are_one_self_contained_file(tmp_path):
    out = simkv("tune", "--decode", "300", "--prompt", "16", "--search", "grid", "--budget", "2", "--param",
                "headroom_base=64,128", "--workers", "1", "--figure", "f.html", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    out = simkv("plan", "--synthetic", "--requests", "20", "--devices", "h100-sxm", "--max-devices", "1", "--tp", "1",
                "--max-num-batched-tokens", "256", "--workers", "1", "--figure", "pf.html", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.html", "pf.html"]  # no plotly.min.js beside them
    for name in ("f.html", "pf.html"):
        page = (tmp_path / name).read_text()
        assert "plotly.min.js" not in page and len(page) > 3_000_000  # plotly.js inlined


# -- the guide -------------------------------------------------------------------------------------------------

GUIDE = ROOT / "docs" / "guide" / "cli.md"


def test_the_guide_names_every_mode_of_every_command():
    """docs/guide/cli.md lists every mode of every command (its commands' outputs: tests/test_docs.py)."""
    text = GUIDE.read_text()
    for name, parser in PARSERS.items():
        for mode in parser.modes:
            assert mode.says in text or mode.says.removeprefix("a single session ") in text, (name, mode.says)
