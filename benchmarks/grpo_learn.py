"""GRPO learns on the CPU: a tiny word-level Llama (random weights, tests/helpers_grpo.py) is trained through
``trainpilot-cli run`` (a separate process, the path users run) to answer a prompt's last word and then stop,
with two rewards: the built-in ``exact_answer`` (the one-token answer must be the prompt's last word) and a
``rewards.python`` function ``from_the_prompt`` weighted 0.5 (partial credit: any word of the prompt). The partial
reward rises first, the exact one after. Prints the rewards per step and the first/last means.

    python benchmarks/grpo_learn.py [--steps 60] [--keep DIR]

``--keep DIR`` leaves the run folder there (tools/screenshots_grpo.py --run DIR photographs its charts).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers_grpo import grpo_config, last_word_records  # noqa: E402


REWARD_FILE = """
def from_the_prompt(prompts, completions, **kwargs):
    \"\"\"Partial credit: 1 when the answer is one of the prompt's words (not the 'last:' cue).\"\"\"
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]  # text, or chat messages
    return [1.0 if t.strip() in p.split()[1:] else 0.0 for p, t in zip(prompts, texts)]
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--keep", type=Path, default=None, help="write the run folder here (kept)")
    args = ap.parse_args(argv)
    import yaml

    with tempfile.TemporaryDirectory(prefix="tp-grpo-learn-") as tmp:
        tmp = Path(tmp)
        (tmp / "my_rewards.py").write_text(REWARD_FILE)
        cfg = grpo_config(tmp, rows=last_word_records(64),
                          training={"max_steps": args.steps, "learning_rate": 1e-2},
                          data={"seq_len": 24},
                          grpo={"max_completion_length": 1, "samples_per_step": 2},
                          rewards={"exact_answer": 1.0, "python": str(tmp / "my_rewards.py"),
                                   "python_weights": {"from_the_prompt": 0.5}},
                          checkpoints={"every_steps": 20})
        cfg["name"] = "grpo-last-word"
        (tmp / "grpo.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        run = args.keep.resolve() if args.keep else tmp / "run"
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "trainer", "run", str(tmp / "grpo.yaml"), "--run-dir", str(run),
                               "--quiet", "--overwrite"], cwd=ROOT, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return proc.returncode
        steps = [e for e in map(json.loads, (run / "events.jsonl").read_text().splitlines()) if e["type"] == "step"]
    print(f"{len(steps)} steps through 'trainpilot-cli run' in {seconds:.1f} s (4 prompts x 8 completions per step)")
    print(f"{'step':>4} {'reward':>7} {'exact':>6} {'prompt':>7} {'no-signal':>9}")
    for s in steps:
        r = s["rewards"]
        print(f"{s['step']:>4} {s['reward']:>7.3f} {r['exact_answer']['mean']:>6.3f} {r['from_the_prompt']['mean']:>7.3f} "
              f"{s['no_signal_fraction']:>9.2f}")
    first, last = steps[:5], steps[-5:]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    for name, key in (("total reward", lambda s: s["reward"]),
                      ("exact_answer", lambda s: s["rewards"]["exact_answer"]["mean"]),
                      ("from_the_prompt", lambda s: s["rewards"]["from_the_prompt"]["mean"]),
                      ("no-signal groups", lambda s: s["no_signal_fraction"])):
        print(f"{name}: steps 1-5 {mean([key(s) for s in first]):.3f} -> last 5 {mean([key(s) for s in last]):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
