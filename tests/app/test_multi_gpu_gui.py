"""The app on machines with several GPUs (issue 47, docs/gpus.md): the card picker on the Environment and Method
pages, the verdict and the bar per card, the preset of the card used, Review's YAML and the exported scripts carrying
the cards, and the dashboard's curves and warnings per card from a replayed two-card trace. Real widgets, offscreen,
on the recordings in tests/fixtures/hardware (published specs)."""
from __future__ import annotations

import json

import pytest
import yaml
from conftest import FIXTURES, SHOWN_MS

from app.model import cards
from app.ops.hardware_feed import HardwareMonitor
from app.views.wizard.page_env import EnvironmentPage
from app.views.wizard.page_plan import PlanPage
from app.views.wizard.state import WizardState
from trainer.hardware.source import planning_snapshot

HW = FIXTURES / "hardware"
DISPLAY_3060 = str(HW / "rtx3060_display_rtx3090.jsonl")  # GPU 0 the 3060 driving the display, GPU 1 the 3090
UUID_3060, UUID_3090 = "GPU-a469d2b2-926c-5d3e-95b1-be736387c132", "GPU-b83b3aad-40c8-529a-af1c-36a8f3574445"


def _state(qtbot, recording: str = DISPLAY_3060):
    hw = HardwareMonitor(recording)
    hw.start()
    qtbot.waitUntil(lambda: hw.latest is not None, timeout=SHOWN_MS)
    return WizardState(hw)


def _planned(qtbot, state, **values):
    state.set("data.seq_len", 512)  # the demo model reads 512 positions (the Model page proposes it)
    for k, v in values.items():
        state.set(k, v)
    state.replan()
    qtbot.waitUntil(lambda: state.plan is not None and not state.planning, timeout=SHOWN_MS)
    return state.plan


def test_rows_say_usable_memory_and_what_holds_each_card():
    rows = cards.card_rows(planning_snapshot(DISPLAY_3060))
    assert [r.index for r in rows] == [0, 1] and [r.uuid for r in rows] == [UUID_3060, UUID_3090]
    small, big = rows
    assert small.display and [n for n, _ in small.holders] == ["Xorg", "gnome-shell", "firefox"]
    assert "held by Xorg" in small.holders_words() and "drives the display" in small.holders_words()
    assert big.holders_words() == "nothing else holds it" and big.usable > 2 * small.usable
    assert cards.best_keys(planning_snapshot(DISPLAY_3060)) == [UUID_3090]
    # the last card stays ticked; ticks come back in NVML order, by UUID
    assert cards.toggled(rows, [UUID_3090], UUID_3090, False) is None
    assert cards.toggled(rows, [UUID_3090], UUID_3060, True) == [UUID_3060, UUID_3090]
    assert cards.toggled(rows, [0, 1], 0, False) == [UUID_3090]
    # three of one card, GPU 0 driving the display: each listed, the planner's first GPU 1 (the lower index of the two
    # idle ones); the preset of the three the 16 GB tier's
    triple = planning_snapshot(str(HW / "triple_rtx5060ti_16gb.jsonl"))
    three = cards.card_rows(triple)
    assert [r.index for r in three] == [0, 1, 2] and cards.best_keys(triple) == [three[1].key] and three[0].display
    assert cards.preset_words(triple, [r.key for r in three]).startswith("Preset: laptop_16gb — the starting point")


def test_environment_page_ticks_the_3090_and_says_why(qtbot):
    state = _state(qtbot)
    page = EnvironmentPage(state=state)
    qtbot.addWidget(page)
    page.show()
    _planned(qtbot, state)
    picker = page.cards
    qtbot.waitUntil(lambda: picker.planner == [UUID_3090], timeout=SHOWN_MS)
    assert picker.isVisible() and set(picker.boxes) == {UUID_3060, UUID_3090}
    assert picker.boxes[UUID_3090].isChecked() and not picker.boxes[UUID_3060].isChecked()
    assert "GPU 1 · NVIDIA GeForce RTX 3090" in picker.boxes[UUID_3090].text()
    assert "usable of 24.0 GiB" in picker.boxes[UUID_3090].text()
    assert "held by Xorg" in picker.held[UUID_3060].text()
    why = picker.why.text()
    assert why.startswith("The planner's choice: GPU 1 (NVIDIA GeForce RTX 3090)") and "most usable memory" in why
    # the last ticked card cannot be unticked (it says why); nothing is written for the planner's choice
    assert picker.boxes[UUID_3090].isEnabled()
    picker.boxes[UUID_3090].click()
    assert picker.boxes[UUID_3090].isChecked() and state.values["distributed.gpus"] == "auto"
    assert "GPU 1 stays ticked: a run trains on at least one card" in picker.why.text()
    assert not picker.auto_button.isEnabled()
    # the preset follows the card used (the 3090: desktop_24gb), not GPU 0 (the 3060 would be laptop_16gb)
    assert state.plan.preset == "desktop_24gb"
    assert picker.preset.text().startswith("Preset: desktop_24gb — the starting point for GPU 1 (NVIDIA GeForce RTX 3090)")


def test_picking_the_smaller_card_never_calls_it_the_best(qtbot):
    state = _state(qtbot)
    page = EnvironmentPage(state=state)
    qtbot.addWidget(page)
    _planned(qtbot, state)
    picker = page.cards
    qtbot.waitUntil(lambda: picker.planner == [UUID_3090], timeout=SHOWN_MS)
    picker.tick(0)  # both
    assert state.values["distributed.gpus"] == [UUID_3060, UUID_3090]
    picker.tick(1, False)  # the 3060 alone
    assert state.values["distributed.gpus"] == [UUID_3060] and "distributed.gpus" in state.explicit
    why = picker.why.text()
    assert why.startswith("Your choice: GPU 0 (NVIDIA GeForce RTX 3060)")
    assert "less than the planner's choice (GPU 1 (NVIDIA GeForce RTX 3090)" in why
    assert "most usable" not in why and "best" not in why
    assert "stays ticked" not in why and picker.auto_button.isEnabled()
    plan = _planned(qtbot, state)
    assert [g["index"] for g in plan.gpus] == [0] and plan.preset == "laptop_16gb"  # the 3060's 12 GB tier
    assert "GPU 0 (NVIDIA GeForce RTX 3060)" in picker.preset.text()
    assert state.final_config().distributed.gpus == [UUID_3060]
    picker.auto_button.click()
    assert state.values["distributed.gpus"] == "auto" and "distributed.gpus" not in state.explicit
    assert picker.boxes[UUID_3090].isChecked() and not picker.boxes[UUID_3060].isChecked()
    plan = _planned(qtbot, state)
    assert [g["index"] for g in plan.gpus] == [1]


def test_method_page_verdict_and_a_bar_per_card(qtbot):
    state = _state(qtbot)
    page = PlanPage(state)
    qtbot.addWidget(page)
    page.resize(900, 700)
    page.show()
    _planned(qtbot, state)
    qtbot.waitUntil(lambda: "budget" in page.verdict.text(), timeout=SHOWN_MS)
    assert "on GPU 1 (NVIDIA GeForce RTX 3090)" in page.verdict.text()
    assert "gpus GPU 1 (NVIDIA GeForce RTX 3090)" in page.details.text()  # the card, not its UUID
    assert page.cards.isVisible() and page.bar.isVisible() and not page.card_bars.isVisible()
    page.cards.tick(0)  # the 3060 and the 3090: uneven, the 3060 binds
    plan = _planned(qtbot, state)
    qtbot.waitUntil(lambda: page.card_bars.isVisible(), timeout=SHOWN_MS)
    assert [g["index"] for g in plan.gpus] == [0, 1] and plan.preset == "laptop_16gb"
    assert not page.bar.isVisible() and len([b for b in page.card_bars.bars if b.isVisible()]) == 2
    lines = [line.text() for line in page.card_bars.lines]
    assert "GPU 0 (NVIDIA GeForce RTX 3060)" in lines[0] and "binds every rank" in lines[0]
    assert "GPU 1 (NVIDIA GeForce RTX 3090)" in lines[1] and "stays unused" in lines[1]
    budgets = [b.budget for b in page.card_bars.bars]
    assert budgets == [g["budget_bytes"] for g in plan.gpus] and budgets[0] < budgets[1]
    assert "per card on 2 cards" in page.verdict.text()
    assert page.cards.why.text().startswith("Your choice: GPUs 0 + 1") and "binds every rank" in page.cards.why.text()


def test_one_gpu_machine_shows_no_picker_on_the_method_page(qtbot):
    state = _state(qtbot, str(HW / "rtx4090_laptop_16gb.jsonl"))
    page = PlanPage(state)
    qtbot.addWidget(page)
    page.show()
    env = EnvironmentPage(state=state)
    qtbot.addWidget(env)
    env.show()
    _planned(qtbot, state)
    assert not page.cards.isVisible() and page.bar.isVisible()
    assert env.cards.isVisible() and env.cards.why.text() == "This machine's one GPU trains the run."
    assert not env.cards.auto_button.isVisible()


def _reviewed(qtbot, state, tmp_path):
    from app.views.wizard.page_review import ReviewPage

    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"text": f"record {i}"}) + "\n" for i in range(50)))
    state.update({"data.path": str(data), "data.seq_len": 256})
    page = ReviewPage(state)
    qtbot.addWidget(page)
    page.initializePage()
    qtbot.waitUntil(lambda: page.result is not None, timeout=SHOWN_MS)
    return page


@pytest.mark.parametrize("ticked, expected", [((), [UUID_3090]), ((0,), [UUID_3060, UUID_3090])])
def test_review_yaml_and_exported_scripts_carry_the_cards(qtbot, tmp_path, cuda_torch, ticked, expected):
    from trainer.launch.export_scripts import export

    state = _state(qtbot)
    env = EnvironmentPage(state=state)
    qtbot.addWidget(env)
    picker = env.cards
    for index in ticked:
        picker.tick(index)
    page = _reviewed(qtbot, state, tmp_path)
    shown = yaml.safe_load(page.yaml.toPlainText())
    assert shown["distributed"]["gpus"] == expected and shown["distributed"]["num_gpus"] == len(expected)
    written = state.write_config(str(tmp_path / "runs" / "r"), page.result.config)
    out = tmp_path / "export"
    export(str(written), str(out))
    cards_var = f"CUDA_VISIBLE_DEVICES={','.join(expected)}"
    assert f"export {cards_var}\n" in (out / "launch.sh").read_text()
    assert "export CUDA_DEVICE_ORDER=PCI_BUS_ID\n" in (out / "launch.sh").read_text()
    assert f'set "{cards_var}"' in (out / "launch.bat").read_text()
    assert yaml.safe_load((out / "config.yaml").read_text())["distributed"]["gpus"] == expected


def test_dashboard_draws_each_card_with_one_legend(qtbot, tmp_path):
    from multi_gpu_trace import STEPS, write_two_card_run

    from app.model.run_data import RunData
    from app.views.dashboard import CARD_COLORS, Dashboard

    data = RunData(write_two_card_run(tmp_path / "runs" / "two-cards"))
    data.poll()
    assert sorted(data.cards) == [0, 1] and data.card_names[1] == "NVIDIA GeForce RTX 3090"
    dash = Dashboard()
    qtbot.addWidget(dash)
    dash.resize(1000, 700)
    dash.show()
    dash.set_data(data)
    for chart in ("vram", "temp", "power", "util"):
        assert not dash.curves[chart].isVisible()  # the one-card curve gives way to a curve per card
        for pos, index in enumerate((0, 1)):
            curve = dash.card_curves[(chart, index)]
            assert curve.opts["pen"].color().name() == CARD_COLORS[pos] and len(curve.xData) == STEPS + 12
    vram_0, vram_1 = dash.card_curves[("vram", 0)].yData, dash.card_curves[("vram", 1)].yData
    assert abs(vram_0[-1] - 10.9) < 0.05 and abs(vram_1[-1] - 9.7) < 0.05  # GiB: each rank's share on its card
    assert max(dash.card_curves[("temp", 0)].yData) == 84.0 and max(dash.card_curves[("temp", 1)].yData) == 66.0
    assert [round(dash.card_totals[i].value()) for i in (0, 1)] == [12, 24] and not dash.total_line.isVisible()
    legend = dash.card_legend.text()
    assert dash.card_legend.isVisible() and legend.count("GPU 0 · NVIDIA GeForce RTX 3060") == 1
    assert legend.count("GPU 1 · NVIDIA GeForce RTX 3090") == 1
    assert dash.throttle_spans and dash.throttle_spans[0][0] == pytest.approx(1_763_800_040.0)
    # two ranks share the effective batch: micro 2 × accumulation 4 × 2 GPUs
    assert "effective batch 16 (micro 2 × accum 4 × 2 GPUs)" in dash.headline.toolTip()
    # a one-card run afterwards: the charts' own curves again, no legend
    dash.set_data(RunData(None))
    assert not dash.card_legend.isVisible() and not dash.card_curves and dash.curves["vram"].isVisible()


def test_warnings_name_the_card(tmp_path):
    from multi_gpu_trace import T0, _card, write_two_card_run

    from app.model.advice import collect
    from app.model.run_data import RunData

    data = RunData(write_two_card_run(tmp_path / "runs" / "two-cards"))
    data.poll()
    hot = {"time": T0 + 50, "gpus": [_card(0, 50), _card(1, 50)], "host": {}}
    texts = [a.text for a in collect(data, hot)]
    heat = [t for t in texts if "°C" in t]
    assert heat == ["GPU 0 (NVIDIA GeForce RTX 3060) at 84.0 °C, throttling (thermal). A lower power limit "
                    "(nvidia-smi -pl) costs less speed than thermal throttling."], texts
    assert "Close firefox to free 0.6 GiB: it is using GPU 0 (NVIDIA GeForce RTX 3060)." in texts
    assert any(t.startswith("The desktop itself (Xorg, gnome-shell)") and "on GPU 0 (NVIDIA GeForce RTX 3060)" in t
               for t in texts)
    keys = [a.key for a in collect(data, hot)]
    assert len(keys) == len(set(keys))
    # one card: the words of a one-GPU machine are unchanged
    one = {"time": T0, "gpus": [_card(0, 50)], "host": {}}
    assert "Close firefox to free 0.6 GiB: it is using this GPU." in [a.text for a in collect(data, one)]


def test_a_cpu_only_pytorch_is_refused_naming_the_run_s_cards_not_gpu_0():
    """Review's "this PyTorch cannot use a GPU" names the card the run trains on (the 3090 the planner picks, or the
    cards ticked), never the 3060 only because it is GPU 0."""
    from types import SimpleNamespace

    from trainer import config as tc
    from trainer.planning.requirements import _torch_cannot_use_gpu

    torch = SimpleNamespace(words=lambda: "torch 2.13.0+cpu, a CPU-only build")
    snap = planning_snapshot(DISPLAY_3060)
    assert "would run on the NVIDIA GeForce RTX 3090 of" in _torch_cannot_use_gpu(torch, snap, tc.RunConfig())
    both = tc.validate({"distributed": {"gpus": [UUID_3060, UUID_3090]}})
    assert "would run on the 2 GPUs (NVIDIA GeForce RTX 3060, NVIDIA GeForce RTX 3090)" in \
        _torch_cannot_use_gpu(torch, snap, both)


def test_header_names_every_card_not_only_gpu_0():
    from app.ops.hardware_feed import describe

    facts = describe(planning_snapshot(DISPLAY_3060))
    assert facts["name"] == "RTX 3060 + RTX 3090" and facts["badge"] == "Desktop"
    assert facts["vram"].startswith("12.0 + 24.0 GiB VRAM, 1.2 + ") and facts["temperature"].endswith(" °C")
    assert describe(planning_snapshot(str(HW / "triple_rtx5060ti_16gb.jsonl")))["name"] == "3× RTX 5060 Ti"
    assert describe(planning_snapshot(str(HW / "rtx4090_laptop_16gb.jsonl")))["name"] == \
        "NVIDIA GeForce RTX 4090 Laptop GPU"


def test_a_model_no_card_holds_splits_its_layers_with_a_line_and_a_bar_per_card(qtbot):
    """QLoRA of Qwen2.5-32B on the 3× RTX 5060 Ti recording: the Method page shows the layers split over the cards,
    each card's bar against its own budget and a line saying which layers it holds (docs/gpus.md)."""
    state = _state(qtbot, str(HW / "triple_rtx5060ti_16gb.jsonl"))
    page = PlanPage(state)
    qtbot.addWidget(page)
    page.resize(900, 700)
    page.show()
    state.set("model.architecture", "qwen2.5-32b")
    state.set("method.type", "qlora")
    plan = _planned(qtbot, state, **{"data.seq_len": 2048, "training.effective_batch_size": 8})
    assert plan.settings.get("distributed.layer_split") is True, plan.reasons[:2]
    qtbot.waitUntil(lambda: page.card_bars.isVisible(), timeout=SHOWN_MS)
    lines = [line.text() for line in page.card_bars.lines if line.isVisible()]
    assert len(lines) == 2 and "(layers 0–" in lines[0] and "the embeddings" in lines[0] and "fits" in lines[0]
    assert "the LM head and the loss" in lines[1] and "binds every rank" not in " ".join(lines)
    budgets = [b.budget for b in page.card_bars.bars if b.isVisible()]
    assert budgets == [g["budget_bytes"] for g in plan.gpus]
    assert "the fullest of 2 cards the layers are split over" in page.verdict.text()
