"""Verification of an export on the user's own model: ``python -m trainer.worker.export.verify EXPORT_DIR [RUN_DIR]``
(a child on the CPU; ``export-model --gguf`` runs it on the staged folder before moving it into place, and
``trainpilot-cli verify-export`` on a written one).

From the export's own record (``trainpilot-export.json``: which run and which of its models it came from), it takes a
few of the run's own prompts (``run_records``) and checks the GGUF in llama.cpp (``llama_checks``: prompt ids,
greedy tokens, stops) and the Modelfile (``modelfile_check``). The result goes to ``<export>/verification.json``:
``"verified"`` true, false, or null (llama-cpp-python is not installed: one line says how to install it), a one-line
``summary`` ("verified in llama.cpp: prompt ids equal, greedy 48/48, stops at <|im_end|>; Ollama template equal"),
and each check with its figures. Exit 0 verified, 4 (``EXIT_EXPORT_DIFFERS``) when anything differs, 2 when it cannot
be verified (no llama-cpp-python, no run), 1 otherwise.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from trainer import config as config_mod
from trainer.core import capabilities
from trainer.core.errors import EXIT_BAD_INPUT, EXIT_EXPORT_DIFFERS, TrainPilotError, UserError
from trainer.hardware.probe import free_cores
from trainer.models.gguf_support import LLAMA_CPP_PYTHON
from trainer.worker.loading import lean, model_parts

RECORD = "trainpilot-export.json"
RESULT = "verification.json"
# what a vision-language export's verification covers (llama_checks: the text GGUF on text prompts, the projector loaded)
PICTURES_SCOPE = "the text model, on text prompts; answers to pictures are not compared"


def install_hint() -> str:
    """The one command that installs llama.cpp's Python binding into this environment (it builds: minutes)."""
    return f'"{sys.executable}" -m pip install "llama-cpp-python=={LLAMA_CPP_PYTHON}"'


def read_record(folder: Path) -> dict:
    """The export's record of where it came from; UserError (exit 2) when ``folder`` is not a TrainPilot GGUF export."""
    path = Path(folder) / RECORD
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UserError(f"{folder}: not an export written by 'trainpilot-cli export-model --gguf' (no readable {RECORD});"
                        f" export the run again with --gguf", path=str(folder)) from None
    if not record.get("gguf") or not (Path(folder) / record["gguf"]).is_file():
        raise UserError(f"{folder}: the GGUF file this export names ({record.get('gguf')}) is missing; export the run "
                        f"again with --gguf", path=str(folder))
    return record


def _source(record: dict, run_dir: Path | None) -> tuple[Path, Path]:
    run = Path(run_dir) if run_dir else Path(record["run_dir"])
    source = run / record["model"] if record.get("model") else Path(record["model_path"])
    if not (run / "config.yaml").is_file() or not source.is_dir():
        raise UserError(f"the run this export came from is not at {run} (model {record.get('model')}); pass its folder: "
                        f"trainpilot-cli verify-export EXPORT_DIR --run-dir RUN_DIR", path=str(run))
    return run, source


def verify(folder: Path, run_dir: Path | None = None, reference: str = "run") -> dict:
    """Run every check on the export in ``folder`` and write ``verification.json``; returns the result.
    ``reference``: the transformers model compared with, ``run`` (the run's own model: base + adapter merged, as
    verify-export does) or ``export`` (the export's own full safetensors, written from that model moments before:
    export-model's check, which then needs no second base model and merge)."""
    started = time.perf_counter()
    folder = Path(folder)
    record = read_record(folder)
    run, source = _source(record, run_dir)
    if not capabilities.installed("llama-cpp-python"):
        result = {"verified": None, "summary": f"not verified: llama-cpp-python is not installed; install it with: "
                                               f"{install_hint()}", "checks": {}}
        return _write(folder, result, started)
    result = _checks(folder, record, run, source, reference)
    return _write(folder, result, started)


def _reference_model(cfg, folder: Path, source: Path, reference: str):
    """The trained model in transformers (fp32, CPU): the export's own full weights (memory-mapped: read when first
    used), or the run's model."""
    from trainer.worker.generate import generation

    if reference == "export" and (folder / "config.json").is_file() and not (folder / "adapter_config.json").is_file():
        from transformers import AutoConfig

        # a vision-language export is its whole checkpoint (towers and all): its own class, not a causal LM's
        auto = model_parts.auto_class(AutoConfig.from_pretrained(str(folder)))
        return auto.from_pretrained(str(folder), dtype="float32").eval()
    return generation.merged_model(cfg, source).eval()


def _checks(folder: Path, record: dict, run: Path, source: Path, reference: str = "run") -> dict:
    """Every check (module doc). llama.cpp answers first (its greedy tokens and logits, KV-cached) and is closed
    before transformers computes, so the two never compete for the cores; transformers then reads llama.cpp's answers
    teacher-forced, one forward a prompt (instead of ``GREEDY_STEPS`` incremental steps). The reference model is
    loaded first: the chat rules take its generation config's end-of-turn ids, and the cases are built from them."""
    cfg = config_mod.load(run / "config.yaml")
    lean.for_run(cfg)  # before torch and transformers
    import torch

    from trainer.worker.export import llama_checks, run_records
    from trainer.worker.generate import generation
    from trainer.worker.loading import modeling

    generation.quiet_libraries()
    tok = modeling.load_tokenizer(cfg, source)
    generation.template_or_run_rendering(cfg, tok)
    model = _reference_model(cfg, folder, source, reference)
    chat = generation.chat_rules(cfg, tok, model)
    cases = run_records.cases(cfg, tok, chat)
    kind, threads = record.get("gguf_type", "f16"), free_cores()
    n_ctx = max(256, max((len(c.ids) for c in cases), default=0) + llama_checks.GREEDY_STEPS + 8)
    llm = llama_checks.load(folder / record["gguf"], n_ctx, threads)
    try:
        checks = {"prompt": llama_checks.prompt_check(llm, tok, cases)}
        answers = llama_checks.greedy_answers(llm, cases)
        checks["stops"] = llama_checks.stop_check(llm, tok, chat.end_of_turn_id(), folder, cases)
        if record.get("mmproj"):
            checks["projector"] = llama_checks.projector_check(llm, folder / record["mmproj"], threads)
    finally:
        llm.close()
    torch.set_num_threads(threads)
    model = llama_checks.f16_stored(model) if kind == "f16" else model
    rows = [llama_checks.teacher_forced_logits(model, c.ids, a[0]) for c, a in zip(cases, answers)]
    checks = {"prompt": checks["prompt"], "greedy": llama_checks.greedy_check(answers, rows, tok, cases, kind),
              **{k: v for k, v in checks.items() if k != "prompt"}}
    ollama = _ollama_check(folder, record, cfg, tok, chat, cases)
    if ollama is not None:
        checks["ollama"] = ollama
    verified = all(c["ok"] is not False for c in checks.values()) and checks["prompt"]["ok"] is True
    scope = PICTURES_SCOPE if model_parts.tower_prefixes(model) else None
    return {"verified": verified, "summary": summary(checks, kind, verified, scope), "checks": checks, "scope": scope,
            "cases": [c.where for c in cases], "gguf": record["gguf"], "gguf_type": kind, "threads": threads,
            "reference": "the export's safetensors" if reference == "export" else f"the run's {source.name}"}


def _ollama_check(folder: Path, record: dict, cfg, tok, chat, cases) -> dict | None:
    """The Modelfile against training's render of ``cases`` (``modelfile_check``); None without a Modelfile."""
    from trainer.worker.export import modelfile_check, ollama

    if not (folder / "Modelfile").is_file():
        return None
    bos = tok.bos_token if ollama.adds_bos(tok) else None

    def want_text(case):
        text = chat.render(case.messages, True)
        return text[len(bos):] if bos and text.startswith(bos) else text
    stops = [tok.convert_ids_to_tokens(i) for i in ollama.stop_ids(tok, chat)]
    return modelfile_check.check(folder, record, cases, want_text, stops, cfg.data.seq_len)


def summary(checks: dict, kind: str, verified: bool, scope: str | None = None) -> str:
    """One line: what was checked and found, or what differs (the first difference of each failed check); ``scope``:
    what a vision-language export's check covers, said at the end."""
    if not verified:
        first = [f"{name}: {c['differences'][0]}" for name, c in checks.items() if c.get("ok") is False
                 and c.get("differences")]
        return "the export differs from training: " + "; ".join(first or ["no prompt of the run could be checked"])
    p, g, s = checks["prompt"], checks["greedy"], checks["stops"]
    ties = f" ({g['near_ties']} near ties)" if g["near_ties"] else ""
    share = "" if kind == "f16" else f", agreement {g['agreement']:.0%} (floor {g['floor']:.0%})"
    line = (f"verified in llama.cpp: prompt ids equal ({p['equal']}/{p['of']}), greedy {g['equal']}/{g['of']}{ties}"
            f"{share}, stops at {s['token']}")
    o = checks.get("ollama")
    if o is not None:
        line += "; Ollama template equal" if o["ok"] else f"; Ollama template not verified: {o.get('not_verified')}"
    m = checks.get("projector")
    if m is not None:
        line += (f"; projector {m['file']} loads in llama.cpp (mtmd) and reads pictures" if m["ok"]
                 else f"; projector not verified: {m.get('not_verified')}")
    return line + (f" ({scope})" if scope else "")


def _write(folder: Path, result: dict, started: float) -> dict:
    version = capabilities.package("llama-cpp-python").version
    result = {**result, "seconds": round(time.perf_counter() - started, 2), "llama_cpp_python": version,
              "checked": time.strftime("%Y-%m-%dT%H:%M:%S")}
    tmp = folder / f".{RESULT}.tmp"
    tmp.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(folder / RESULT)
    return result


def main(argv: list[str]) -> int:
    """``EXPORT_DIR [RUN_DIR] [--reference-export]``: verify, print the summary line, exit 0 / 4 / 2 (module doc)."""
    reference = "export" if "--reference-export" in argv else "run"
    argv = [a for a in argv if a != "--reference-export"]
    try:
        result = verify(Path(argv[0]), Path(argv[1]) if len(argv) > 1 else None, reference)
    except TrainPilotError as exc:
        print(f"trainpilot: {exc}", file=sys.stderr)
        return exc.exit_code
    print(result["summary"], flush=True)
    if result["verified"] is None:
        return EXIT_BAD_INPUT
    return 0 if result["verified"] else EXIT_EXPORT_DIFFERS


if __name__ == "__main__":
    lean.own_process()  # a child of export-model or verify-export: it may leave unused libraries unimported
    sys.exit(main(sys.argv[1:]))
