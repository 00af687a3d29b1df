"""The plan's reasons are derived from the numbers the plan shows (issue 29, item 6): over many configs × recorded
machines, no sentence contradicts the breakdown, the budget or the savings rows. A saver that saves nothing is not
claimed to save; "the largest that fits" is said only of a plan that fits; DeepSpeed is never "off because the model
states fit" beside states that do not; the budget's subtraction, as printed, adds up."""
from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from trainer import config as tc
from trainer.core.units import GIB
from trainer.hardware.recording import ReplayProbe
from trainer.planning.budget import host_budget
from trainer.planning.plan import plan_run
from trainer.planning.reasons import STATE_PARTS

HW = Path(__file__).parent / "fixtures" / "hardware"
RECORDINGS = ("rtx4090_laptop_16gb", "desktop_24gb", "rtx5090_32gb", "no_gpu")
ARCHS = ("smollm-135m", "qwen2.5-0.5b", "llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "gemma-2-2b", "flan-t5-base")
NUM = r"(-?\d+(?:\.\d+)?) GiB"


def _g(n: float) -> float:
    return round(n / GIB, 1)


def _close(shown: str, exact_bytes: float) -> bool:
    """A printed GiB figure is the number's own (to its last printed digit)."""
    return abs(float(shown) - exact_bytes / GIB) <= 0.051


def contradictions(plan) -> list[str]:
    """Every reason of ``plan`` whose figures disagree with the plan's numbers (empty: none)."""
    d, out = plan.to_dict(), []
    peak = d["predicted_peak_bytes"] if d["device"] == "cuda" else d["host_ram_needed_bytes"]
    budget = d["budget_bytes"]
    host_ok = (d["host_ram_needed_bytes"] or 0) <= host_budget(d["host_ram_available_bytes"], d["goal"])[0] \
        or d["device"] == "cpu"
    fits = peak is not None and peak <= budget and host_ok  # in memory (a CPU QLoRA plan fits, cannot run)
    if peak is not None and sum(d["breakdown"].values()) != peak:  # a CPU plan's runtime was left out once
        out.append(f"the breakdown ({sum(d['breakdown'].values())}) does not add up to the peak ({peak})")
    for r in d["reasons"]:
        def bad(why: str, r=r) -> None:
            out.append(f"{why}: {r}")
        for m in re.finditer(r"saves " + NUM, r):
            if float(m.group(1)) <= 0:
                bad("a saving of nothing is claimed")
        if "budget" in r and "=" in r and r is d["reasons"][0]:
            numbers = [float(x) for x in re.findall(NUM, r)]
            if round(numbers[0] - sum(numbers[1:-1]), 2) != numbers[-1]:
                bad("the budget's subtraction does not add up")
            if abs(numbers[-1] - budget / GIB) > 0.0051:
                bad("the budget line's result is not the plan's budget")
        if "is the largest that fits" in r:
            if not fits:
                bad("'largest that fits' on a plan that does not fit")
            host = re.search(r"would need " + NUM + r" of host RAM(?: while sampling)?, over the " + NUM + " usable", r)
            hair = re.search(r"would need " + NUM + r"(?: while sampling)?, (\d+) MiB over the " + NUM + " budget", r)
            m = re.search(r"would need " + NUM, r)
            if host:  # the next size's offloaded activations are over the host RAM the plan may use
                if float(host.group(1)) <= float(host.group(2)) or not _close(host.group(2), host_budget(d["host_ram_available_bytes"], d["goal"])[0]):
                    bad("the next micro-batch's host RAM is not over the usable host RAM")
            elif hair:  # a hair over: the excess is printed, and the budget is the plan's
                if int(hair.group(2)) < 1 or abs(float(hair.group(3)) - budget / GIB) > 0.0051:
                    bad("the next micro-batch is not shown over the plan's budget")
            elif m and float(m.group(1)) <= _g(budget):
                bad("the next micro-batch 'would need' no more than the budget")
        if "DeepSpeed off" in r and "fit" in r and "not" not in r and not fits:
            bad("DeepSpeed off because things fit, on a plan that does not fit")
        m = re.search(r"keeps " + NUM + " of weights, gradients and optimizer states", r)
        if m and not _close(m.group(1), sum(v for k, v in d["breakdown"].items() if k in STATE_PARTS)):
            bad("the model states figure is not the breakdown's")
        m = re.search(r"the predicted peak " + NUM + r" is over the \S+ budget " + NUM, r)
        if m and not (_close(m.group(1), peak) and _close(m.group(2), budget) and peak > budget):
            bad("the verdict's peak or budget is not the plan's")
        m = re.search(r"without it even the smallest micro-batch needs " + NUM + r" \(" + NUM + " with it", r)
        if m and not (float(m.group(1)) > float(m.group(2)) and _close(m.group(2), peak)):
            bad("checkpointing's 'without it' is not more than the plan's peak")
        if r.startswith("closing ") and d["verdict"] == "fits":
            bad("programs to close on a plan that fits")
    for row, r in ((row, r) for row in d["savings"] for r in d["reasons"] if r.startswith(row["label"] + ":")):
        if row["saves_bytes"] < GIB / 20 and "saves" in r.split(";")[0].replace("saves no", ""):
            out.append(f"a saver that saves nothing is said to save: {r}")
        if row["without_bytes"] - row["saves_bytes"] != peak:
            out.append(f"a saving is not measured from the plan's peak: {row}")
    return out


def _plans():
    snaps = {n: ReplayProbe(HW / f"{n}.jsonl").snapshot() for n in RECORDINGS}
    for (name, snap), arch, method, seq in itertools.product(snaps.items(), ARCHS, ("full", "lora", "qlora"), (512, 4096)):
        if arch.startswith("flan") and method == "qlora":
            continue
        base = {"model": {"source": arch, "architecture": arch, "tokenizer": "demo"}, "method": {"type": method},
                "data": {"seq_len": seq}}
        variants = [base, dict(base, plan_goal="most_headroom"),
                    dict(base, speed={"gradient_checkpointing": True, "activation_offload": False})]
        if not arch.startswith("flan"):
            variants += [dict(base, training={"objective": "dpo"}),
                         dict(base, training={"objective": "grpo"}, rewards={"exact_answer": 1.0},
                              grpo={"max_completion_length": seq // 4})]
        for v in variants if seq == 4096 else variants[:1] + variants[3:]:
            yield f"{name}/{arch}/{method}/{seq}/{sorted(v)}", plan_run(tc.validate(v), snap)


@pytest.mark.slow  # ~500 plans: a few seconds to a minute on a loaded 2-core machine
def test_no_reason_contradicts_the_plans_numbers():
    found = {name: bad for name, plan in _plans() if (bad := contradictions(plan))}
    assert not found, "\n".join(f"{k}: {v}" for k, v in list(found.items())[:20])


def _plan(arch: str, method: str):
    return plan_run(tc.validate({"model": {"source": arch, "architecture": arch, "tokenizer": "demo"},
                                 "method": {"type": method}}), ReplayProbe(HW / "rtx4090_laptop_16gb.jsonl").snapshot())


def test_the_checker_catches_each_contradiction():
    """The property test can fail: each kind of contradiction, planted in a real plan, is caught."""
    big, small = _plan("llama-3.1-8b", "full"), _plan("llama-3.2-1b", "lora")
    assert big.verdict == "does_not_fit" and small.verdict == "fits"
    assert not contradictions(big) and not contradictions(small)
    for plan, planted in ((big, "gradient checkpointing: saves -2.2 GiB; without it this would need 9.0 GiB of VRAM"),
                          (big, "micro-batch 1 is the largest that fits (2 would need 99.0 GiB); accumulation 16"),
                          (big, "DeepSpeed off: the model states fit on the GPU without it (it would only add overhead)"),
                          (big, "chunked loss (exact): saves -0.0 GiB; without it this would need 9.0 GiB of VRAM"),
                          (small, "closing firefox (pid 1, 1.8 GiB) frees 1.8 GiB of VRAM; then it fits")):
        plan.reasons.append(planted)
        assert contradictions(plan), planted
        plan.reasons.pop()
    big.reasons[0] = big.reasons[0].replace("= ", "= 1")  # 16.00 − … = 112.75: does not add up
    assert contradictions(big)
