"""GRPO runs' learning signals from their events (no Qt): the reward of each reward function and the weighted
total (mean and spread per step), the share of prompt groups with no learning signal, completion length and
clipping, KL and entropy; and the sampled answers with their rewards for the Samples tab.

The worker writes (docs/grpo.md): ``step`` events with ``reward``, ``reward_std``, ``rewards`` = {function:
{"mean", "std"}}, ``no_signal_fraction``, ``completion_length``, ``completion_clipped``, ``kl`` (only with
grpo.beta > 0) and ``entropy``; ``run_started`` with ``objective: "grpo"``, ``reward_functions`` and
``reward_weights``; ``sample`` events with ``source: "grpo"``, ``reward``, ``rewards`` {function: value} and
``advantage``; ``eval`` events (with validation data and ``training.eval_every_steps``) with ``reward``,
``reward_std`` and ``rewards``: the validation prompts' sampled completions scored by the run's rewards. A missing
or non-numeric value is a gap (NaN), never a zero.

Reading is split as in ``run_data``: ``grpo_columns(step_events)`` runs on the reader thread and turns step
events into plain columns; ``GrpoSeries.extend(columns)`` appends them on the GUI thread.
"""
from __future__ import annotations

import math

from app.model.series import Series
from trainer.rundir.records import OBJECTIVE_FIELDS

# Step fields charted as they are (name → the series of GrpoSeries that holds them): typed in the trainer's records.
SCALARS = ("reward", "reward_std", "no_signal_fraction", "completion_length", "completion_clipped", "kl", "entropy")
assert set(SCALARS) <= set(OBJECTIVE_FIELDS), set(SCALARS) - set(OBJECTIVE_FIELDS)


def is_grpo_step(e: dict) -> bool:
    """True for a step event that carries GRPO reward metrics."""
    return "reward" in e or isinstance(e.get("rewards"), dict)


def grpo_columns(steps: list[dict]) -> dict:
    """Columns of GRPO ``step`` events (reader thread): ``{"x": [step], <scalar>: [value or NaN],
    "functions": {name: {"mean": [..], "std": [..]}}}``; a function absent from a step is NaN there."""
    cols: dict = {"x": [], **{k: [] for k in SCALARS}, "functions": {}}
    for i, e in enumerate(steps):
        cols["x"].append(float(e["step"]))
        for k in SCALARS:
            cols[k].append(_nan(e.get(k)))
        per = e.get("rewards") if isinstance(e.get("rewards"), dict) else {}
        for name, v in per.items():
            f = cols["functions"].setdefault(str(name), {"mean": [math.nan] * i, "std": [math.nan] * i})
            mean, std = (v.get("mean"), v.get("std")) if isinstance(v, dict) else (v, None)
            f["mean"].append(_nan(mean))
            f["std"].append(_nan(std))
        for f in cols["functions"].values():  # functions this step did not report
            for k in ("mean", "std"):
                if len(f[k]) < i + 1:
                    f[k].append(math.nan)
    return cols


class Band:
    """One reward's mean per step and its spread: ``mean``, ``low`` (mean − std) and ``high`` (mean + std)."""

    def __init__(self):
        self.mean, self.low, self.high = Series(), Series(), Series()

    def extend(self, xs: list[float], means: list[float], stds: list[float]) -> None:
        """Append points; a missing std draws no band there (low = high = NaN)."""
        self.mean.extend(xs, means)
        self.low.extend(xs, [m - s for m, s in zip(means, stds)])
        self.high.extend(xs, [m + s for m, s in zip(means, stds)])


class GrpoSeries:
    """Step-indexed GRPO series of one run: ``total`` (weighted reward Band), ``functions`` {name: Band} in the
    order the run named them, ``validation`` (the weighted reward on the validation prompts, a Band at each
    evaluation), and Series ``no_signal``, ``clipped`` (fractions 0-1), ``completion_length`` (tokens), ``kl``,
    ``entropy``."""

    def __init__(self):
        self.total = Band()
        self.validation = Band()
        self.functions: dict[str, Band] = {}
        self.weights: dict[str, float] = {}
        self.no_signal, self.clipped = Series(), Series()
        self.completion_length, self.kl, self.entropy = Series(), Series(), Series()
        self.version = 0
        self._steps = 0  # points appended so far (a function first seen later is NaN before)

    def __len__(self) -> int:
        return self._steps

    def started(self, e: dict) -> None:
        """A ``run_started`` event: the reward functions named in order, with their weights."""
        names = e.get("reward_functions")
        if not isinstance(names, list):
            return
        weights = e.get("reward_weights") if isinstance(e.get("reward_weights"), list) else []
        for i, name in enumerate(map(str, names)):
            self._band(name)
            if i < len(weights) and _num(weights[i]) is not None:
                self.weights[name] = float(weights[i])
        self.version += 1

    def extend(self, cols: dict) -> None:
        """Append the columns of ``grpo_columns`` (GUI thread; numpy copies only)."""
        xs = cols["x"]
        if not xs:
            return
        self.total.extend(xs, cols["reward"], cols["reward_std"])
        for name, f in cols["functions"].items():
            self._band(name).extend(xs, f["mean"], f["std"])
        for name, band in self.functions.items():
            if name not in cols["functions"]:
                band.extend(xs, [math.nan] * len(xs), [math.nan] * len(xs))
        self.no_signal.extend(xs, cols["no_signal_fraction"])
        self.clipped.extend(xs, cols["completion_clipped"])
        self.completion_length.extend(xs, cols["completion_length"])
        self.kl.extend(xs, cols["kl"])
        self.entropy.extend(xs, cols["entropy"])
        self._steps += len(xs)
        self.version += 1

    def drop_after(self, step: float) -> None:
        """Drop every point beyond ``step`` (a run resumed from an older checkpoint redoes those steps)."""
        for band in (self.total, self.validation, *self.functions.values()):
            for series in (band.mean, band.low, band.high):
                series.drop_after(step)
        for series in (self.no_signal, self.clipped, self.completion_length, self.kl, self.entropy):
            series.drop_after(step)
        self._steps = len(self.total.mean)
        self.version += 1

    def evaluated(self, e: dict) -> None:
        """An ``eval`` event: GRPO's validation reward at its step (events without a reward are not GRPO's)."""
        step, reward = _num(e.get("step")), _num(e.get("reward"))
        if step is None or reward is None:
            return
        self.validation.extend([step], [reward], [_nan(e.get("reward_std"))])
        self.version += 1

    def _band(self, name: str) -> Band:
        band = self.functions.get(name)
        if band is None:
            band = self.functions[name] = Band()
            if self._steps:  # first reported after earlier steps: a gap there, x aligned with the others
                xs = list(self.total.mean.x)
                band.extend(xs, [math.nan] * len(xs), [math.nan] * len(xs))
        return band

    def label(self, name: str) -> str:
        """'exact_answer ×2' (its weight when not 1), for legends."""
        w = self.weights.get(name)
        return name if w is None or w == 1.0 else f"{name} ×{w:g}"


def sample_rewards(e: dict) -> dict | None:
    """A GRPO ``sample`` event's scores: ``{"reward": total or None, "rewards": {name: value or None},
    "advantage": value or None}``; None for a sample without rewards (supervised runs' samples)."""
    if e.get("source") != "grpo" and "reward" not in e and not isinstance(e.get("rewards"), dict):
        return None
    per = e.get("rewards") if isinstance(e.get("rewards"), dict) else {}
    return {"reward": _num(e.get("reward")), "rewards": {str(k): _num(v) for k, v in per.items()},
            "advantage": _num(e.get("advantage"))}


def sample_html(e: dict) -> str:
    """One sample in full for the Samples tab's detail pane: its prompt, its answer (whitespace kept) and, for a GRPO
    sample, its total reward, advantage and every function's score."""
    import html

    def pre(text) -> str:
        return f"<pre style='white-space:pre-wrap;margin-top:0'>{html.escape(str(text or ''))}</pre>"

    out = [f"<p><b>Step {html.escape(str(e.get('step')))}</b> — prompt</p>", pre(e.get("prompt")),
           f"<p><b>Answer</b> ({html.escape(str(e.get('tokens', '?')))} tokens)</p>", pre(e.get("text"))]
    scores = sample_rewards(e)
    if scores is not None:
        adv = scores["advantage"]
        rows = "".join(f"<tr><td>{html.escape(n)}</td><td align='right'>{score_text(v)}</td></tr>"
                       for n, v in scores["rewards"].items())
        out.append(f"<p><b>Reward {score_text(scores['reward'])}</b> (weighted total) · advantage "
                   f"{'–' if adv is None else f'{adv:+.3g}'} (above 0: this answer was reinforced; below: pushed "
                   f"away)</p><table cellspacing='0' cellpadding='2'>{rows}</table>")
    return "".join(out)


def score_text(v: float | None) -> str:
    """A reward as short text ('1', '0.5', '-0.25', '–' when missing)."""
    return "–" if v is None else f"{v:.3g}"


def rewards_text(rewards: dict) -> str:
    """'exact_answer 1 · format 0' (every function's score, in the event's order)."""
    return " · ".join(f"{name} {score_text(v)}" for name, v in rewards.items())


def _num(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _nan(v) -> float:
    n = _num(v)
    return math.nan if n is None else n
