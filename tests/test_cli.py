"""End-to-end tests of the ``simkv`` command, run as a user would (a subprocess)."""

import csv
import json
import subprocess
import sys

import pytest

JSON_KEYS = {
    "peak_allocated_bytes", "peak_resident_bytes", "final_allocated_bytes", "mean_allocated_bytes",
    "used_bytes", "realloc_count", "bytes_copied", "max_spike_bytes", "steps",
}
LEDGER_COLUMNS = ["step", "phase", "request", "layer", "tensor", "op", "bytes", "capacity_tokens", "used_tokens", "buffer"]
TINY = ["--model", "custom", "--layers", "2", "--kv-heads", "8", "--head-dim", "64"]


def simkv(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "simkv.cli", *args], capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_run_without_arguments_runs_the_default_scenario():
    out = simkv("run").stdout
    assert "llama-3-8b" in out and "openvino-gpu" in out and "prefill:1024,decode:2048" in out
    for label in ("peak allocated", "peak resident", "mean allocated", "reallocations", "bytes copied", "largest spike"):
        assert label in out


def test_json_summary_has_the_contract_keys_as_integers():
    data = json.loads(simkv("run", *TINY, "--precision", "u8", "--policy", "openvino-cpu",
                            "--prompt", "32", "--decode", "4200", "--json").stdout)
    assert JSON_KEYS <= data.keys()
    assert all(isinstance(data[k], int) for k in JSON_KEYS)
    assert data["steps"] == 4201 and data["realloc_count"] == 2 * 2 * 7
    assert data["per_layer"][0]["alloc_steps"] == [0, 33, 99, 231, 495, 1023, 2079, 4191]


def test_ledger_csv_and_parquet(tmp_path):
    csv_path, pq_path = tmp_path / "ledger.csv", tmp_path / "ledger.parquet"
    simkv("run", *TINY, "--policy", "openvino-cpu", "--prompt", "32", "--decode", "100", "--ledger", str(csv_path))
    with csv_path.open() as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == LEDGER_COLUMNS
    assert rows[0]["phase"] == "prefill" and rows[0]["tensor"] == "k_beam" and rows[0]["op"] == "alloc"
    assert {r["step"] for r in rows if r["tensor"] == "k"} == {"0", "33", "99"}
    simkv("run", *TINY, "--policy", "openvino-cpu", "--prompt", "32", "--decode", "100", "--ledger", str(pq_path))
    pq = pytest.importorskip("pyarrow.parquet")
    table = pq.read_table(pq_path)
    assert table.column_names == LEDGER_COLUMNS and table.num_rows == len(rows)


def test_outputs_are_byte_identical_across_runs(tmp_path):
    outputs = []
    for i in range(2):
        ledger, timeline = tmp_path / f"l{i}.csv", tmp_path / f"t{i}.html"
        js = simkv("run", "--prompt", "100", "--decode", "500", "--json", "--ledger", str(ledger), "--timeline", str(timeline)).stdout
        outputs.append((js, ledger.read_bytes(), timeline.read_bytes()))
    assert outputs[0] == outputs[1]
    assert b"plotly" in outputs[0][2]


def test_reference_engine_gives_the_same_summary():
    args = (*TINY, "--prompt", "20", "--decode", "300", "--turns", "1", "--beam", "3", "--json")
    fast = json.loads(simkv("run", *args).stdout)
    ref = json.loads(simkv("run", *args, "--engine", "reference").stdout)
    assert fast == ref


def test_policies_and_models_listings():
    policies = simkv("policies").stdout
    for name in ("openvino-gpu", "openvino-cpu", "fixed", "geometric", "exact", "static"):
        assert f"{name}:" in policies
    assert "headroom_base=128" in policies and "stagger=64" in policies
    models = simkv("models").stdout
    for name in ("llama-2-7b", "llama-3-8b", "mistral-7b", "qwen2.5-7b", "phi-3.5-mini", "tinyllama-1.1b", "gpt2"):
        assert name in models


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt", "-5"], "prompt must be a positive integer"),
        (["--layers", "-2"], "layers must be a positive integer"),
        (["--prompt", "abc"], "invalid int value"),
        (["--policy", "magic"], "unknown policy 'magic'"),
        (["--model", "gpt-9"], "unknown model 'gpt-9'"),
        (["--precision", "fp6"], "unknown precision 'fp6'"),
        (["--policy-opt", "stagger"], "--policy-opt expects KEY=VALUE"),
        (["--policy-opt", "stagger=lots"], "not a valid int"),
        (["--policy", "static", "--prompt", "5000"], "does not fit max_prompt_len"),
        (["--device-memory=-1GiB"], "cannot read '-1GiB' as a size"),
        (["--ops", "decode:5"], "needs a prompt first"),
        (["--ledger", "/proc/nope/x.csv", "--decode", "5"], "directory /proc/nope does not exist"),
        (["--ledger", "out.xlsx", "--decode", "5"], "must end in .csv or .parquet"),
        (["--engine", "turbo"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args, message, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "simkv.cli", "run", *args], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_out_of_memory_is_reported():
    # the KV cache alone (--weights-memory 0) in 100 MiB: it runs, then runs out (the weights would not fit at all:
    # refused before running, tests/test_contract.py)
    proc = simkv("run", "--device-memory", "100MiB", "--weights-memory", "0", "--policy", "openvino-cpu", check=False)
    assert proc.returncode == 3 and proc.stdout.startswith("simkv: OUT OF MEMORY")
    proc = simkv("run", "--device-memory", "100MiB", "--weights-memory", "0", "--policy", "openvino-cpu", "--json",
                 check=False)
    assert proc.returncode == 3
    data = json.loads(proc.stdout)
    assert data["oom_step"] is not None and data["oom"].startswith("out of memory")


def test_app_refuses_a_taken_port_in_one_line_before_starting(tmp_path):
    """A port another process listens on: one line naming it, exit code 2, and no Dash banner (the server never
    starts); a port out of range and a host that does not resolve alike."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args, message in ((["--port", str(port)], f"--port {port}: cannot listen on 127.0.0.1:{port} "),
                              (["--port", "70000"], "--port must be in 1..65535, got 70000"),
                              (["--host", "no-such-host.invalid"], "--host no-such-host.invalid: cannot be resolved")):
            proc = subprocess.run([sys.executable, "-m", "simkv.cli", "app", *args], capture_output=True, text=True,
                                  cwd=tmp_path, timeout=60)
            assert proc.returncode == 2 and proc.stdout == "", proc.stderr
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("simkv app: error: " + message), proc.stderr


def test_ledger_suffix_is_matched_in_any_case_and_refused_in_the_contracts_words(tmp_path):
    """The contract matches a format's suffix in any case (simkv.limits.check_output lowers it): ``l.CSV`` is a CSV
    ledger, ``l.Parquet`` a Parquet one; any other name is the contract's one line, nothing written."""
    for name in ("l.CSV", "l.Parquet"):
        proc = subprocess.run([sys.executable, "-m", "simkv.cli", "run", *TINY, "--decode", "4", "--ledger", name],
                              capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "l.CSV").read_text().startswith(",".join(LEDGER_COLUMNS) + "\n")
    assert (tmp_path / "l.Parquet").read_bytes()[:4] == b"PAR1"
    proc = subprocess.run([sys.executable, "-m", "simkv.cli", "run", "--ledger", "l.txt"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and proc.stderr == ("simkv run: error: --ledger l.txt: the file name must end in .csv "
                                                    "or .parquet (see simkv run --help)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.CSV", "l.Parquet"]


def test_simkv_alone_prints_the_top_level_help_and_exits_2():
    """No command: the help listing every command (simkv.cli.COMMANDS) on stderr, exit code 2 — argparse's code
    for a usage error, so a script that lost its command still fails — and nothing on stdout."""
    from simkv.cli import COMMANDS, build_parser

    proc = subprocess.run([sys.executable, "-m", "simkv.cli"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == build_parser().format_help()
    assert all(f"    {c.__name__.rsplit('.', 1)[1]} " in proc.stderr for c in COMMANDS)


def test_cost_names_fixes_that_work_on_the_device():
    """When the weights do not fit, simkv cost's warning names the fixes simkv run would (simkv.scenario.weight_fixes),
    each one that works there: on the Xeon (OpenVINO: no tensor parallelism) only lighter weights for deepseek-v3
    (int4: 312 GiB of its 625 GiB at int8 fit 512 GiB); on an H100 (vLLM) llama-3-70b's 131 GiB of f16 weights fit a
    B200, two H100s, or 66 GiB at int8. Each named cost fix prices without the warning; the serving line runs. The MoE
    line's "1 token" is singular."""
    proc = simkv("cost", "--model", "deepseek-v3")
    assert proc.stderr == ("simkv cost: warning: 624.94 GiB of int8 weights + 35.30 MiB of KV do not fit xeon-8480's "
                           "512.00 GiB: priced as if they did (--weights-precision int4, or size a deployment with "
                           "simkv plan)\n")
    assert "(8 per token, 1 token)" in proc.stdout
    assert simkv("cost", "--model", "deepseek-v3", "--weights-precision", "int4").stderr == ""
    warning = simkv("cost", "--model", "llama-3-70b", "--device", "h100-sxm").stderr
    fixes = warning.split("priced as if they did (", 1)[1].rstrip(")\n").split(", ")
    assert fixes == ["--device h200-sxm", "serve it with simkv run --synthetic --model llama-3-70b --device h100-sxm --tp 2",
                     "--weights-precision int8", "or size a deployment with simkv plan"]
    for fix in (["--device", "h200-sxm"], ["--device", "h100-sxm", "--weights-precision", "int8"]):
        assert simkv("cost", "--model", "llama-3-70b", *fix).stderr == ""
    assert simkv(*fixes[1].split()[4:]).returncode == 0


def test_python_dash_m_simkv_is_the_same_command():
    """``python -m simkv`` (simkv/__main__.py) runs the same command line as the ``simkv`` script, exit codes included."""
    args = ["run", *TINY, "--decode", "4", "--json"]
    ok = subprocess.run([sys.executable, "-m", "simkv", *args], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout == simkv(*args).stdout
    bad = subprocess.run([sys.executable, "-m", "simkv", "run", "--decode", "-1"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stderr.strip()
