"""Print docs/after-training.md's per-family export table from a run of tests/test_gguf_llama_cpp.py.

Runs that test file (llama.cpp itself via llama-cpp-python, tests/real_models.py's tiny models of each
family with its real tokenizer and chat template) with ``TRAINPILOT_FAMILIES_OUT`` set, so each family
records its figures, and ``TRAINPILOT_FAMILIES_Q8=1`` so q8_0 is converted too; then prints a Markdown
table. ``--from FILE`` prints the table of an earlier run's JSON lines without running anything.

    .venv/bin/python benchmarks/families_table.py [--from results.jsonl] [--keep results.jsonl]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEADER = ("| family | GGUF f16 | GGUF q8_0 | llama.cpp tokens = HF tokenizer | greedy tokens = transformers "
          "| chat prompt = training (render + ids) | stops at end of turn | Ollama TEMPLATE (Go) = Jinja |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")


def _frac(a, b) -> str:
    return "–" if a is None else f"{a}/{b}"


def row(r: dict) -> str:
    """One Markdown table row for one family's recorded figures."""
    tokens = _frac(r["tokens"], r["tokens_of"])
    if r.get("sentencepiece") is not None:
        tokens += f" (SentencePiece itself: {r['sentencepiece']}/{r['tokens_of']})"
    greedy = _frac(r["greedy"], r["greedy_of"]) + ("" if r["greedy"] == r["greedy_of"] else " (near ties)")
    q8 = {True: "written, loads", None: "not run", False: "failed"}[r.get("q8_0")]
    return (f"| {r['family']} | written, loads | {q8} | {tokens} | {greedy} | {_frac(r['chat'], r['chat_of'])} "
            f"| {'yes' if r['stops'] else 'no'} | {_frac(r['ollama'], r['ollama_of'])} |")


def run_tests(out: Path, q8: bool) -> int:
    """Run the family tests, recording into ``out``; returns pytest's exit status."""
    env = dict(os.environ, TRAINPILOT_FAMILIES_OUT=str(out), **({"TRAINPILOT_FAMILIES_Q8": "1"} if q8 else {}))
    cmd = [sys.executable, "-m", "pytest", "tests/test_gguf_llama_cpp.py", "-q", "-p", "no:cacheprovider"]
    return subprocess.run(cmd, cwd=REPO, env=env).returncode


def main(argv: list[str] | None = None) -> int:
    """Run (or read) and print the table; exit 1 when a family failed or none ran."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="source", type=Path, help="JSON lines of an earlier run (no tests run)")
    p.add_argument("--keep", type=Path, help="also keep this run's JSON lines here")
    p.add_argument("--no-q8", action="store_true", help="skip the q8_0 conversions (faster)")
    args = p.parse_args(argv)
    status = 0
    if args.source:
        path = args.source
    else:
        path = args.keep or Path(tempfile.mkdtemp()) / "families.jsonl"
        path.unlink(missing_ok=True)
        status = run_tests(path, not args.no_q8)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.is_file() else []
    if not rows:
        print("no family ran (is llama-cpp-python installed and the llama-cpp-python sdist unpacked?)", file=sys.stderr)
        return 1
    print(HEADER)
    for r in rows:
        print(row(r))
    return 1 if status else 0


if __name__ == "__main__":
    sys.exit(main())
