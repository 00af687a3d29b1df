"""What the chunked loss saves and costs, on the CPU (issues 21 and 33). Prints its figures; not a pass/fail test.

    python benchmarks/chunked_loss.py                       # memory at seq 2048 x micro 4, then the loss, then runs
    python benchmarks/chunked_loss.py --micro 1 --pairs 3   # less host RAM (HF's loss needs ~16 bytes per logit)
    python benchmarks/chunked_loss.py --skip-memory --skip-runs          # the loss alone
    python benchmarks/chunked_loss.py --skip-speed | --skip-memory | --skip-runs

Memory: one training step (forward, backward, AdamW step) of a Qwen2-shaped tiny model with Qwen's
151,936-token vocabulary (hidden 64, 2 layers), fp32, each path in its own process: HF's loss
(``speed.loss_kernel: hf``) and the chunked one. Each child reports its peak RSS (``ru_maxrss``) and the
bytes autograd saves for backward (unique storages through ``saved_tensors_hooks``, parameters excluded; the
chunked loss keeps its gradients outside those hooks, ≈4·tokens·h + 4·V·h bytes, not counted). The RSS saving
is compared with the planner's: its ``logits_loss`` term plus the head's activations (both from
``trainer.planning.memory.estimate``, host ``training`` bytes).

Speed of the loss alone (``--skip-memory --skip-runs``): forward and backward of the LM head and the loss over
``--tokens`` labelled tokens of hidden size ``--hidden`` (Qwen's 151,936-token vocabulary, fp32), HF's
(``lm_head`` + ``ForCausalLMLoss``) against ``chunked_causal_lm_loss``, in one process, alternating, median of
``--repeats`` each.

Speed of runs: ``python -m trainer run`` (what users run: supervisor + worker, separate processes) of the
Qwen2-shaped 151,936-vocabulary model on the demo data (the demo tokenizer; the model still scores every one of
its 151,936 logits) at sequence 128, 8 sequences per step, alternating chunked / HF's loss, tokens/s from the worker's ``step`` events
(median of steps after the first 5); the figure is the median over pairs of chunked/HF.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.core.paths import DEMO_CONFIG  # noqa: E402

VOCAB = 151_936
SHAPE = dict(model_type="qwen2", hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=4096, tie_word_embeddings=True)
GIB = 2**30


def _hf_loss(hidden, head, labels, vocab):
    from transformers.loss.loss_utils import ForCausalLMLoss

    return ForCausalLMLoss(head(hidden), labels, vocab)


def loss_speed(tokens: int, hidden: int, repeats: int) -> dict:
    """Seconds of forward + backward of the LM head and the loss, HF's against the chunked one (median)."""
    import time

    import torch

    from trainer.worker.kernels.chunked_loss import chunked_causal_lm_loss

    torch.manual_seed(0)
    head = torch.nn.Linear(hidden, VOCAB, bias=False)
    x = torch.randn(1, tokens, hidden, requires_grad=True)
    labels = torch.randint(0, VOCAB, (1, tokens))
    wrapped = torch.nn.Sequential(head)  # not a plain Linear: the checkpointed chunks, as before issue 33
    runs = {"hf": lambda: _hf_loss(x, head, labels, VOCAB),
            "chunked": lambda: chunked_causal_lm_loss(x, head, labels, vocab=VOCAB),
            "previous": lambda: chunked_causal_lm_loss(x, wrapped, labels, vocab=VOCAB, chunk_tokens=104)}
    want = {k: float(f().detach()) for k, f in runs.items()}  # warm-up, and the losses to compare
    times = {k: [] for k in runs}
    for i in range(repeats):
        for k in (("hf", "chunked", "previous") if i % 2 == 0 else ("previous", "chunked", "hf")):
            x.grad, head.weight.grad = None, None
            t0 = time.perf_counter()
            runs[k]().backward()
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio, before = med["hf"] / med["chunked"], med["hf"] / med["previous"]
    print(f"loss alone: {tokens} tokens x hidden {hidden} x vocabulary {VOCAB}, fp32, forward + backward, "
          f"median of {repeats}: HF {med['hf'] * 1e3:.0f} ms, chunked {med['chunked'] * 1e3:.0f} ms, previous chunked "
          f"(104-token checkpointed chunks) {med['previous'] * 1e3:.0f} ms; chunked speed = {ratio:.3f}x HF's "
          f"(previous {before:.3f}x); losses {want['hf']:.6f} / {want['chunked']:.6f} / {want['previous']:.6f}")
    return {"tokens": tokens, "hidden": hidden, "repeats": repeats, "seconds": times, "median_seconds": med,
            "chunked_speed_vs_hf": ratio, "previous_speed_vs_hf": before, "losses": want}


def one_step(chunked: bool, seq: int, micro: int) -> dict:
    """Child: one training step; peak RSS and autograd-saved bytes (bytes)."""
    import torch
    import transformers

    from trainer.worker.kernels import chunked_loss
    from trainer.worker.probes.memory_probe import saved_storages

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**SHAPE),
                                                          dtype=torch.float32, attn_implementation="sdpa")
    if chunked:
        assert chunked_loss.install(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, VOCAB, (micro, seq))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with saved_storages(model) as seen:
        loss = model(input_ids=ids, labels=ids).loss  # the Trainer keeps the loss, not the outputs
    saved = sum(seen.values())
    loss.backward()
    opt.step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"chunked": chunked, "loss": float(loss), "saved_bytes": saved, "peak_rss_bytes": peak,
            "rss_before_step_bytes": before}


def planner_saving(seq: int, micro: int) -> dict:
    """The planner's host bytes for the same step, HF's loss against the chunked one."""
    from trainer.models.spec import spec_from_config
    from trainer.planning.memory import TrainSetup, estimate

    spec = spec_from_config(dict(SHAPE, architectures=["Qwen2ForCausalLM"]), name="qwen2-tiny-151k")
    out = {}
    for chunked in (False, True):
        s = TrainSetup(micro_batch=micro, seq_len=seq, precision="fp32", weights_16bit=False, device="cpu",
                       loss_kernel="chunked" if chunked else "hf")
        b = estimate(spec, s).breakdown
        out[chunked] = {"logits_loss": b.get("logits_loss", 0), "activations": b.get("activations", 0)}
    f, t = out[False], out[True]
    return {"logits_loss_standard": f["logits_loss"], "logits_loss_chunked": t["logits_loss"],
            "saving": (f["logits_loss"] + f["activations"]) - (t["logits_loss"] + t["activations"])}


def memory(seq: int, micro: int) -> dict:
    rows = {}
    for chunked in (False, True):
        proc = subprocess.run([sys.executable, __file__, "--one", json.dumps([chunked, seq, micro])],
                              capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        if proc.returncode:
            raise SystemExit(proc.stderr[-2000:])
        rows[chunked] = json.loads(proc.stdout.strip().splitlines()[-1])
    plan = planner_saving(seq, micro)
    std, chk = rows[False], rows[True]
    rss_saving = std["peak_rss_bytes"] - chk["peak_rss_bytes"]
    print(f"memory: one training step, Qwen2-shaped tiny model, V={VOCAB}, seq {seq} x micro {micro}, fp32, CPU")
    for name, r in (("standard (HF loss)", std), ("chunked", chk)):
        print(f"  {name:20s} peak RSS {r['peak_rss_bytes'] / GIB:6.2f} GiB   autograd-saved {r['saved_bytes'] / GIB:6.3f} GiB"
              f"   loss {r['loss']:.6f}")
    print(f"  peak RSS saving {rss_saving / GIB:.2f} GiB; autograd-saved saving {(std['saved_bytes'] - chk['saved_bytes']) / GIB:.3f} GiB")
    print(f"  planner: logits_loss {plan['logits_loss_standard'] / GIB:.2f} GiB -> {plan['logits_loss_chunked'] / GIB:.3f} GiB; "
          f"saving with the head's log-softmax {plan['saving'] / GIB:.2f} GiB; measured/planned = {rss_saving / plan['saving']:.3f}")
    return {"seq": seq, "micro": micro, "standard": std, "chunked": chk, "planner": plan,
            "rss_saving_bytes": rss_saving, "ratio_measured_to_planned": rss_saving / plan["saving"]}


def demo_run(chunked: bool, steps: int, tmp: Path, tag: str) -> float:
    """Median tokens/s of one ``trainpilot-cli run`` of the 151,936-vocabulary model on the demo data (steps
    after the first 5)."""
    arch = tmp / "qwen2-tiny-151k.json"
    arch.write_text(json.dumps(dict(SHAPE, architectures=["Qwen2ForCausalLM"], bos_token_id=1, eos_token_id=2)))
    cfg = yaml.safe_load(DEMO_CONFIG.read_text())
    cfg["model"] = {"source": "demo-tiny-llama", "architecture": str(arch), "tokenizer": "demo"}
    # 8 sequences of 128 tokens per step (1,024 tokens × 151,936 logits: the loss is most of the step's work)
    cfg["training"].update(max_steps=steps, effective_batch_size=8, micro_batch_size=4, gradient_accumulation_steps=2)
    cfg["speed"]["loss_kernel"] = "chunked" if chunked else "hf"
    cfg["checkpoints"] = {"every_steps": 10_000, "keep_last": 1, "save_final_model": False}
    cfg["output"] = {"tensorboard": False}
    path = tmp / f"{tag}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = tmp / tag
    proc = subprocess.run([sys.executable, "-m", "trainer", "run", str(path), "--run-dir", str(run), "--quiet"],
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines() if x.strip()]
    started = next(e for e in events if e["type"] == "run_started")
    assert started["loss_kernel"] == ("chunked" if chunked else "hf"), started
    return statistics.median(e["tokens_per_second"] for e in events if e["type"] == "step" and e["step"] > 5)


def speed(pairs: int, steps: int) -> dict:
    ratios, tps = [], {True: [], False: []}
    with tempfile.TemporaryDirectory() as d:
        for i in range(pairs):
            order = (True, False) if i % 2 == 0 else (False, True)  # alternate who goes first
            got = {c: demo_run(c, steps, Path(d), f"{i}-{c}") for c in order}
            for c in got:
                tps[c].append(got[c])
            ratios.append(got[True] / got[False])
            print(f"  pair {i + 1}: chunked {got[True]:,.0f} tok/s, HF's loss {got[False]:,.0f} tok/s, ratio {ratios[-1]:.3f}")
    med = statistics.median(ratios)
    print(f"runs: 151,936-vocabulary model at seq 128 through trainpilot-cli run, {pairs} alternating pairs of {steps} "
          f"steps: chunked/HF tokens/s median ratio {med:.3f} (each pair: {', '.join(f'{r:.3f}' for r in ratios)})")
    return {"pairs": pairs, "steps": steps, "ratios": ratios, "median_ratio": med, "tokens_per_second": tps}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=1024, help="labelled tokens for the loss-alone timing")
    ap.add_argument("--hidden", type=int, default=256, help="hidden size for the loss-alone timing")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--skip-speed", action="store_true", help="neither the loss alone nor the runs")
    ap.add_argument("--skip-runs", action="store_true")
    ap.add_argument("--out", help="also write the figures as JSON here")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # child: [chunked, seq, micro]
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one_step(*json.loads(a.one))))
        return 0
    out = {}
    if not a.skip_memory:
        out["memory"] = memory(a.seq, a.micro)
    if not a.skip_speed:
        out["loss_speed"] = loss_speed(a.tokens, a.hidden, a.repeats)
    if not a.skip_speed and not a.skip_runs:
        out["speed"] = speed(a.pairs, a.steps)
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
