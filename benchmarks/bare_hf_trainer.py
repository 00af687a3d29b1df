"""A bare Hugging Face ``transformers.Trainer`` script: the baseline ``benchmarks/overhead.py`` compares with.

    python benchmarks/bare_hf_trainer.py CONFIG.yaml --steps-out steps.jsonl

Reads the same run config YAML that ``trainpilot-cli run`` gets (plain PyYAML, not TrainPilot's
schema; every value it uses must be explicit there, no ``auto``) and trains as a user's own script
would: a model randomly initialised from ``trainer/resources/models/<architecture>.json`` with the
config's seed, the bundled demo texts (read with TrainPilot's light record reader) tokenized with the
demo tokenizer and packed into ``data.seq_len`` sequences here as TrainPilot packs them (records in the
seeded order, packed per chunk of 8,192, the blocks trained in order), ``transformers.default_data_collator``,
and the plain ``transformers.Trainer`` with the config's training values (micro-batch, accumulation,
learning rate and schedule, warmup, steps, seed, weight decay, clipping, precision, optimizer), no
checkpoints. Everything else is left at HF's defaults (logging every 500 steps, the tqdm bar,
``report_to="none"`` so no logger is picked up by accident).

One callback takes ``time.perf_counter()`` at every ``on_step_end`` and writes the marks as JSON
lines (``{"step", "t", "tokens"}``; the first line, step 0, is the start and carries step 1's loss)
when training ends (not per step: the baseline pays nothing for
being measured).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.data.readers import read_records  # noqa: E402  (the light reader: records, no tokenizing)


def packed_dataset(cfg: dict, tokenizer):
    """``datasets.Dataset`` of ``seq_len`` token blocks as TrainPilot packs them: the records put in the
    order of a permutation seeded by ``training.seed`` (when ``data.shuffle``, the default), bos + text +
    eos per record, concatenated per 8,192 records and cut into full blocks (the remainder of each batch
    is dropped), with ``position_ids`` that restart at each document and block and no attention mask, so
    transformers keeps packed documents apart (block-diagonal attention)."""
    import datasets

    d = cfg["data"]
    seq_len = int(d["seq_len"])
    records = read_records(d["path"], d.get("format", "auto"))
    texts = [str(r[d.get("text_field", "text")]) for r in records.rows]
    if d.get("shuffle", True):
        import numpy as np

        texts = [texts[i] for i in np.random.default_rng(int(cfg["training"]["seed"])).permutation(len(texts))]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    bos = [bos] if bos is not None and bos != eos else []

    def pack(batch):
        docs = [[*bos, *text, eos] for text in tokenizer(batch["text"], add_special_tokens=False)["input_ids"]]
        ids = [t for doc in docs for t in doc]
        doc_start = [s for doc, s in zip(docs, _starts(docs)) for _ in doc]  # each token's document start
        block = min(seq_len, len(ids))
        out = {"input_ids": [], "labels": [], "position_ids": []}
        for b in range(0, (len(ids) // block) * block, block):
            out["input_ids"].append(ids[b:b + block])
            out["labels"].append(ids[b:b + block])
            out["position_ids"].append([i - max(doc_start[i], b) for i in range(b, b + block)])
        return out

    datasets.disable_progress_bars()
    raw = datasets.Dataset.from_dict({"text": texts})
    return raw.map(pack, batched=True, batch_size=8192, remove_columns=["text"])


def _starts(docs: list[list[int]]) -> list[int]:
    """Offset of each document in the concatenated stream."""
    out, at = [], 0
    for doc in docs:
        out.append(at)
        at += len(doc)
    return out


def tokenizer_for(cfg: dict):
    """The demo's tokenizer (the one TrainPilot trains locally on the bundled data and caches)."""
    from trainer.data.readers import bundled_demo_path
    from trainer.worker.datapipe.tokenizer import demo_tokenizer

    if cfg["model"]["source"] != "demo-tiny-llama" or cfg["data"]["path"] != "demo":
        raise SystemExit("bare_hf_trainer.py: only the demo tokenizer and data (model.source demo-tiny-llama, data.path demo)")
    return demo_tokenizer(bundled_demo_path())


def build_model(cfg: dict, precision: str):
    """Random init from the architecture JSON, seeded, on the config's device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    arch = ROOT / "trainer" / "resources" / "models" / f"{cfg['model'].get('architecture') or 'tiny-llama'}.json"
    conf = AutoConfig.for_model(**{k: v for k, v in json.loads(arch.read_text()).items() if not k.startswith("_")})
    torch.manual_seed(int(cfg["training"]["seed"]))
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    with torch.device("cuda" if cfg["device"] == "cuda" else "cpu"):
        model = AutoModelForCausalLM.from_config(conf, dtype=dtype,
                                                 attn_implementation=cfg["model"].get("attn_implementation", "sdpa"))
    model.config.use_cache = False
    return model


def training_arguments(cfg: dict, out_dir: Path):
    """The config's training values as ``TrainingArguments``; HF defaults for the rest."""
    from transformers import TrainingArguments

    t, s = cfg["training"], cfg["speed"]
    cuda = cfg["device"] == "cuda"
    precision = s["precision"]
    optim = "adamw_torch_fused" if cuda and s.get("fused_adamw", True) else "adamw_torch"
    return TrainingArguments(
        output_dir=str(out_dir), per_device_train_batch_size=int(t["micro_batch_size"]),
        gradient_accumulation_steps=int(t["gradient_accumulation_steps"]), max_steps=int(t["max_steps"]),
        learning_rate=float(t["learning_rate"]), lr_scheduler_type=t["lr_scheduler"],
        warmup_steps=int(t.get("warmup_steps", 0)), weight_decay=float(t.get("weight_decay", 0.0)),
        max_grad_norm=float(t.get("max_grad_norm", 1.0)), optim=optim, seed=int(t["seed"]), data_seed=int(t["seed"]),
        bf16=precision == "bf16", fp16=precision == "fp16", use_cpu=not cuda,
        save_strategy="no", report_to="none",
        train_sampling_strategy="sequential",  # the blocks in the packed order, as TrainPilot's first epoch
        logging_first_step=True)  # step 1's loss, to check both sides train the same model on the same data


def main(argv=None) -> int:
    """Train; write the per-step marks to ``--steps-out``. Returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", help="run config YAML (explicit values, no 'auto')")
    ap.add_argument("--steps-out", required=True, help="JSON lines: one per optimizer step")
    ap.add_argument("--out-dir", default=None, help="Trainer output_dir (nothing is saved into it)")
    args = ap.parse_args(argv)
    cfg = yaml.safe_load(Path(args.config).read_text())
    if cfg["speed"]["precision"] not in ("fp32", "bf16", "fp16"):
        raise SystemExit("bare_hf_trainer.py: speed.precision must be explicit (fp32, bf16 or fp16)")

    from transformers import Trainer, TrainerCallback, default_data_collator

    tokenizer = tokenizer_for(cfg)
    train = packed_dataset(cfg, tokenizer)
    model = build_model(cfg, cfg["speed"]["precision"])
    t = cfg["training"]
    tokens_per_step = int(t["micro_batch_size"]) * int(t["gradient_accumulation_steps"]) * int(cfg["data"]["seq_len"])
    marks: list[tuple[int, float]] = []

    class Marks(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if cfg["device"] == "cuda" and state.global_step == state.max_steps:
                import torch

                torch.cuda.synchronize()  # only the last mark waits for the GPU: the window ends with its work done
            marks.append((state.global_step, time.perf_counter()))

    out_dir = Path(args.out_dir or Path(args.steps_out).with_suffix(".trainer"))
    trainer = Trainer(model=model, args=training_arguments(cfg, out_dir), train_dataset=train,
                      data_collator=default_data_collator, callbacks=[Marks()])
    start = time.perf_counter()
    trainer.train()
    first_loss = next((h["loss"] for h in trainer.state.log_history if h.get("step") == 1 and "loss" in h), None)
    with open(args.steps_out, "w", encoding="utf-8") as f:
        f.write(json.dumps({"step": 0, "t": start, "tokens": 0, "loss": first_loss}) + "\n")  # train start (not a step)
        for step, t_end in marks:
            f.write(json.dumps({"step": step, "t": t_end, "tokens": tokens_per_step}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
