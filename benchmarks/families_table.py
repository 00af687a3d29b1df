"""Print docs/after-training.md's per-family export table from a run of tests/test_family_training.py.

Runs tests/test_family_masks.py (the assistant-only masks of each family's real template: multi-turn,
history-rewriting templates, tool calls) and reads each family's results from pytest's JUnit XML, then
runs tests/test_family_training.py (each family of tests/real_models.py trained through ``trainpilot-cli run``,
exported with ``export-model --gguf f16 --ollama``, its export verified in llama.cpp, then llama.cpp itself via
llama-cpp-python compared with transformers) with ``TRAINPILOT_FAMILIES_OUT`` set, so each family records its
figures, and ``TRAINPILOT_FAMILIES_Q8=1`` so q8_0 is converted too; then prints a Markdown table. ``--from FILE``
prints the table of an earlier run's JSON lines without running anything.

    .venv/bin/python benchmarks/families_table.py [--from results.jsonl] [--keep results.jsonl] [--families A B]

``--families`` runs only those families (their rows; pytest ``-k``), e.g. after adding one to tests/real_models.py.
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
HEADER = ("| family | masks exact (checks passed) | GGUF f16 | GGUF q8_0 | llama.cpp tokens = HF tokenizer | greedy tokens = transformers "
          "| chat prompt = training (render + ids) | stops at end of turn | Ollama TEMPLATE (Go) = Jinja "
          "| export's own verification (after training) |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")


def _frac(a, b) -> str:
    return "–" if a is None else f"{a}/{b}"


def mask_results(xml: Path) -> dict[str, tuple[int, int]]:
    """``{family: (passed, run)}`` from the JUnit XML of tests/test_family_masks.py (a test counts for the
    family named in its parameters)."""
    import xml.etree.ElementTree as ET

    out: dict[str, list[int]] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = case.get("name", "")
        if "[" not in name:
            continue
        family = name[name.index("[") + 1:-1]
        ok = not any(child.tag in ("failure", "error", "skipped") for child in case)
        counts = out.setdefault(family, [0, 0])
        counts[0] += ok
        counts[1] += 1
    return {k: (a, b) for k, (a, b) in out.items()}


def _only(families: list[str] | None) -> list[str]:
    """pytest arguments that select the tests of ``families`` (all when None)."""
    return ["-k", " or ".join(families)] if families else []


def run_masks(xml: Path, families: list[str] | None = None) -> int:
    """Run the per-family mask tests, writing JUnit XML to ``xml``; returns pytest's exit status."""
    cmd = [sys.executable, "-m", "pytest", "tests/test_family_masks.py", "-q", "-p", "no:cacheprovider",
           f"--junitxml={xml}", *_only(families)]
    return subprocess.run(cmd, cwd=REPO).returncode


def row(r: dict, masks: tuple[int, int] | None = None) -> str:
    """One Markdown table row for one family's recorded figures."""
    tokens = _frac(r["tokens"], r["tokens_of"])
    if r.get("sentencepiece") is not None:
        tokens += f" (SentencePiece itself: {r['sentencepiece']}/{r['tokens_of']})"
    greedy = _frac(r["greedy"], r["greedy_of"]) + ("" if r["greedy"] == r["greedy_of"] else " (near ties)")
    q8 = {True: "written, loads", None: "not run", False: "failed"}[r.get("q8_0")]
    mask = "–" if masks is None else ("yes" if masks[0] == masks[1] else "NO") + f" ({masks[0]}/{masks[1]})"
    return (f"| {r['family']} | {mask} | written, loads | {q8} | {tokens} | {greedy} | {_frac(r['chat'], r['chat_of'])} "
            f"| {'yes' if r['stops'] else 'no'} | {_frac(r['ollama'], r['ollama_of'])} | {r.get('verification', '–')} |")


def run_tests(out: Path, q8: bool, families: list[str] | None = None) -> int:
    """Run the family tests, recording into ``out``; returns pytest's exit status."""
    env = dict(os.environ, TRAINPILOT_FAMILIES_OUT=str(out), **({"TRAINPILOT_FAMILIES_Q8": "1"} if q8 else {}))
    cmd = [sys.executable, "-m", "pytest", "tests/test_family_training.py", "-q", "-p", "no:cacheprovider",
           *_only(families)]
    return subprocess.run(cmd, cwd=REPO, env=env).returncode


def main(argv: list[str] | None = None) -> int:
    """Run (or read) and print the table; exit 1 when a family failed or none ran."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="source", type=Path, help="JSON lines of an earlier run (no tests run)")
    p.add_argument("--keep", type=Path, help="also keep this run's JSON lines here")
    p.add_argument("--no-q8", action="store_true", help="skip the q8_0 conversions (faster)")
    p.add_argument("--families", nargs="+", help="run these families only (names as in tests/real_models.py)")
    args = p.parse_args(argv)
    status, masks = 0, {}
    if args.source:
        path = args.source
    else:
        path = args.keep or Path(tempfile.mkdtemp()) / "families.jsonl"
        path.unlink(missing_ok=True)
        xml = path.with_suffix(".masks.xml")
        status = run_masks(xml, args.families) | run_tests(path, not args.no_q8, args.families)
        masks = mask_results(xml) if xml.is_file() else {}
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.is_file() else []
    if not rows:
        print("no family ran (is llama-cpp-python installed and the llama-cpp-python sdist unpacked?)", file=sys.stderr)
        return 1
    print(HEADER)
    for r in rows:
        print(row(r, masks.get(r["family"])))
    return 1 if status else 0


if __name__ == "__main__":
    sys.exit(main())
