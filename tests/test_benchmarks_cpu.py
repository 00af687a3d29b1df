"""The benchmark scripts run in their CPU modes so they cannot rot (figures are not checked here:
they are measurements of whatever machine runs them)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def run(script, *args, timeout=240):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True, text=True,
                         cwd=ROOT, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_probe_cost_prints_both_paths(tmp_path):
    text = run("probe_cost.py", "--repeat", "5", "--json", str(tmp_path / "p.json"))
    assert "snapshot (full)" in text and "sample (light)" in text
    rows = json.loads((tmp_path / "p.json").read_text())["rows"]
    assert {r["path"] for r in rows} == {"live", "replay"} and all(r["median_ms"] >= 0 for r in rows)


@pytest.mark.slow  # forward/backward passes in a child process
def test_memory_accuracy_cpu_smoke(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "m.json"
    text = run("memory_accuracy.py", "--cpu-smoke", "--out", str(out))
    assert "states pred" in text
    data = json.loads(out.read_text())
    assert data["meta"]["mode"] == "cpu-smoke" and len(data["results"]) >= 3
    for r in data["results"]:
        assert r["ran"] and r["measured_states_bytes"] > 0 and r["measured_activation_bytes"] > 0
        # the CPU smoke is also a real check of the estimator's components
        assert abs(r["predicted_states_bytes"] / r["measured_states_bytes"] - 1) <= 0.10
        assert abs(r["predicted_activation_bytes"] / r["measured_activation_bytes"] - 1) <= 0.10


@pytest.mark.slow  # trains in a child process
def test_speed_stack_cpu_smoke(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "s.json"
    text = run("speed_stack.py", "--stack", "--cpu-smoke", "--out", str(out))
    assert "baseline" in text and "seed claims" in text
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["stage"] == "baseline" and rows[0]["tokens_per_second"] > 0
    skipped = {r["stage"] for r in rows if r["settings"].get("skip")}
    assert "+ TF32" in skipped  # needs CUDA: reported as skipped, never estimated
    assert all("tokens_per_second" in r for r in rows if r["stage"] not in skipped)


@pytest.mark.slow  # trains through trainpilot-cli run, twice
def test_speed_real_path_cpu_smoke(tmp_path):
    """The real-path rows (trainpilot-cli run per loss kernel) in CPU mode: the default and the chunked loss run
    and report what the worker installed; the rows a CPU cannot run say why instead of a figure."""
    pytest.importorskip("torch")
    out = tmp_path / "r.json"
    text = run("speed_stack.py", "--cpu-smoke", "--rows", "0,2,3,5", "--steps", "4", "--out", str(out), timeout=900)
    data = json.loads(out.read_text())
    rows = {r["row"]: r for r in data["rows"]}
    assert data["meta"]["mode"] == "cpu-smoke" and "| row | loss kernel run |" in text
    assert rows["default (the planner's choice)"]["loss_kernel"] == "hf"  # HF's loss fits: the planner keeps it
    assert rows["chunked loss"]["loss_kernel"] == "chunked" and rows["chunked loss"]["micro_batch"] == 4
    for r in (rows["default (the planner's choice)"], rows["chunked loss"]):
        assert r["exit_code"] == 0 and r["tokens_per_second"] > 0 and r["timed_steps"] >= 1
    assert rows["Liger's fused loss"]["skip"] == "Liger's kernels need an NVIDIA GPU"
    assert "compile skipped in CPU mode" in rows["compile + HF's loss"]["skip"]


@pytest.mark.slow  # a child process or a model load: seconds (pytest -m 'not slow' stays under 4 min)
def test_gpu_modes_refuse_cleanly_without_cuda(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for script in ("speed_stack.py", "memory_accuracy.py"):
        out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--out", str(tmp_path / "x")],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert out.returncode == 2 and "needs an NVIDIA GPU" in out.stderr


@pytest.mark.slow  # plans 23 models × 2 machines × 3 methods
def test_catalog_fit_prints_the_table(tmp_path):
    text = run("catalog_fit.py", "--json", str(tmp_path / "c.json"))
    rows = json.loads((tmp_path / "c.json").read_text())["rows"]
    assert "| Qwen/Qwen3-30B-A3B |" in text and len(rows) >= 20
    assert all(c["verdict"] != "unknown" for r in rows for c in r["cells"].values())


@pytest.mark.slow  # a structure probe child, real forwards
def test_arch_activations_prints_planned_vs_measured(tmp_path):
    pytest.importorskip("torch")
    text = run("arch_activations.py", "--families", "lfm2", "--json", str(tmp_path / "a.json"), timeout=900)
    row = json.loads((tmp_path / "a.json").read_text())["rows"][0]
    assert "| lfm2 |" in text and set(row["cases"]) == {"full", "checkpointing", "lora", "tiled"}


@pytest.mark.slow  # CLI children and one structure probe
def test_plan_cost_prints_both_paths_and_the_first_plan(tmp_path):
    text = run("plan_cost.py", "--repeat", "1", "--arch", "qwen3-0.6b", "--json", str(tmp_path / "p.json"),
               timeout=900)
    assert "plan_run (own work)" in text and "trainpilot-cli plan" in text
    rows = json.loads((tmp_path / "p.json").read_text())["rows"]
    assert [(r["case"], r["path"]) for r in rows] == [
        ("shipped record", "plan_run (own work)"), ("shipped record", "trainpilot-cli plan"),
        ("new architecture (probe child)", "trainpilot-cli plan"), ("the same, cached", "trainpilot-cli plan"),
        ("the same, cached", "plan_run (own work)")]
    assert all(r["median_s"] > 0 for r in rows)
    assert "probe child" in rows[2]["note"] and not rows[3]["note"] and not rows[1]["note"]


@pytest.mark.slow  # a few hundred plans
def test_the_longest_context_table_in_the_planner_doc_is_current():
    """docs/planner.md's long-context table is printed by benchmarks/longest_context.py, never typed."""
    run("longest_context.py", "--check", str(ROOT / "docs" / "planner.md"))


@pytest.mark.slow  # two CLI children
def test_gpu_truth_dry_plans_the_long_context_rows_on_their_own_cards():
    text = run("gpu_truth.py", "--dry", "--only", "10-11")
    lines = text.splitlines()
    assert len(lines) == 2 and "rtx4090_laptop_16gb-apps-closed" in lines[0] and "desktop_24gb" in lines[1]
    assert all("fits" in x and " tiled seq " in x and " offload" in x for x in lines), text
    listed = run("gpu_truth.py", "--list")
    assert "long-8b-laptop  (cards: rtx4090_laptop_16gb-apps-closed)" in listed


@pytest.mark.slow  # a small Llama trained 3 steps per optimizer class
def test_fused_step_cpu_smoke(tmp_path):
    pytest.importorskip("bitsandbytes")
    out = tmp_path / "f.json"
    text = run("in_backward_step.py", "--cpu-smoke", "--out", str(out), timeout=600)
    assert "fused_equals_separate" in text
    data = json.loads(out.read_text())
    assert data["arithmetic"] and all(r["within_test_bound"] for r in data["arithmetic"])
    assert {r["optimizer"] for r in data["fused_equals_separate"]} == {"adamw", "paged_adamw_32bit", "adamw_8bit",
                                                                     "paged_adamw_8bit"}
    assert all(r["bit_identical"] for r in data["fused_equals_separate"])
