"""The layers of one model split over several cards in one process (issue 47 item 3, docs/gpus.md): QLoRA of a model
no 16 GB card holds (Qwen2.5-32B) planned over the 3× RTX 5060 Ti recording, each card within its own budget; what
each card holds, conserved against the one-card estimate; the config's keys and their bad values; the one process
with the run's cards; and the worker's device_map, built on a real model and run through accelerate's hooks."""
from __future__ import annotations

from pathlib import Path

import pytest

from trainer import config as C
from trainer.config.resolved import resolve_launcher
from trainer.core.errors import UserError
from trainer.hardware.recording import ReplayProbe
from trainer.launch import argv
from trainer.models.spec import load_model_spec
from trainer.planning import layer_split
from trainer.planning.memory import estimate
from trainer.planning.plan import plan_run
from trainer.planning.setup import TrainSetup

HW = Path(__file__).parent / "fixtures" / "hardware"
TRIPLE = HW / "triple_rtx5060ti_16gb.jsonl"
MIXED = HW / "rtx3060_display_rtx3090.jsonl"
GIB = 2**30


def snap(path: Path):
    return ReplayProbe(path).snapshot()


def cfg(**dotted):
    base = {"model": {"architecture": "qwen2.5-32b"}, "method": {"type": "qlora"}, "data": {"seq_len": 2048},
            "training": {"effective_batch_size": 8}}
    out = C.validate(base)
    return C.replace(out, **dotted) if dotted else out


def test_qlora_of_a_32b_model_splits_over_the_5060_tis_each_card_within_its_budget():
    """One 16 GB card does not hold Qwen2.5-32B's 4-bit weights; nor do two as data-parallel ranks (each holds the
    whole model). The planner splits the layers over the fewest cards that take them, says so, and each card's
    share fits its own budget."""
    plan = plan_run(cfg(), snap(TRIPLE))
    words = " ".join(plan.reasons)
    assert plan.verdict == "fits", words
    assert plan.settings["distributed.layer_split"] is True
    counts = plan.settings["distributed.layers_per_gpu"]
    assert sum(counts) == 64 and len(counts) == len(plan.gpus) == 2 and min(counts) >= 1
    for entry in plan.gpus:
        assert entry["rank_peak_bytes"] <= entry["budget_bytes"], entry
    assert [e["first_layer"] for e in plan.gpus] == [0, counts[0]]
    assert plan.gpus[-1]["holds_head"] and not plan.gpus[0]["holds_head"]  # untied head: on the last card
    assert "GPU 1 (NVIDIA GeForce RTX 5060 Ti) alone does not fit" in words
    assert "the layers split over them: fits" in words
    assert "(2× NVIDIA GeForce RTX 5060 Ti): does not fit" in words  # the same cards as ranks, compared
    assert "layers 0–" in words and "the LM head and the loss" in words
    assert plan.predicted_peak_bytes == max(e["rank_peak_bytes"] for e in plan.gpus)


def test_three_cards_asked_for_split_over_three():
    plan = plan_run(cfg(**{"distributed.num_gpus": 3}), snap(TRIPLE))
    assert plan.verdict == "fits"
    assert len(plan.settings["distributed.layers_per_gpu"]) == 3 and sum(plan.settings["distributed.layers_per_gpu"]) == 64
    assert all(e["rank_peak_bytes"] <= e["budget_bytes"] for e in plan.gpus)
    assert plan.resolved.distributed.layer_split is True and plan.resolved.world_size == 1
    assert resolve_launcher(plan.resolved) == "single"  # one process sees every card of the split
    env = argv.visible_devices_env(plan.resolved)
    assert env["CUDA_VISIBLE_DEVICES"].count("GPU-") == 3


def test_a_run_that_fits_as_ranks_is_not_split():
    """LoRA of a small model fits every card: the split (one card computing at a time) is never planned."""
    small = C.replace(cfg(), **{"model.architecture": "llama-3.2-1b", "method.type": "lora"})
    plan = plan_run(small, snap(TRIPLE))
    assert plan.verdict == "fits"
    assert plan.settings.get("distributed.layer_split") in (None, False)
    assert "split" not in " ".join(plan.reasons[:1])


def test_each_card_holds_its_share_and_the_shares_add_up_to_the_whole():
    """Conservation: the cards' weights and adapters add up to the one-card estimate's; what every card has once
    (the CUDA context, one layer's recompute) is on each; the head's activations and the loss on the head's card
    only. A component lost or counted twice fails here."""
    spec = load_model_spec("qwen2.5-32b")
    s = TrainSetup(micro_batch=1, seq_len=2048, method="qlora", checkpointing=True, loss_kernel="chunked")
    whole = estimate(spec, s)
    budgets = (15 * GIB, 15 * GIB, 15 * GIB)
    split = estimate(spec, s.but(split_over=budgets))
    cards = split.cards
    assert len(cards) == 3 and sum(c["layers"] for c in cards) == spec.layers
    for key in ("weights", "adapter_states"):
        total = sum(c["breakdown"].get(key, 0) for c in cards)
        assert abs(total - whole.breakdown[key]) <= 3 * 64, key  # int rounding per card
    for key in ("cuda_context", "recompute", "dequant_buffer"):
        assert all(c["breakdown"][key] == whole.breakdown[key] for c in cards), key
    assert [bool(c["breakdown"].get("logits_loss")) for c in cards] == [False, False, True]
    acts = sum(c["breakdown"].get("activations", 0) for c in cards)
    assert abs(acts - whole.breakdown["activations"]) <= 3 * 64
    # the peak the search sees is the fullest card's, and each card's peak is the sum of its parts
    fullest = min(cards, key=lambda c: c["budget_bytes"] - c["peak_bytes"])
    assert split.peak_bytes == fullest["peak_bytes"] == layer_split.fullest(cards)["peak_bytes"]
    assert all(c["peak_bytes"] == sum(c["breakdown"].values()) for c in cards)
    assert split.peak_bytes < whole.peak_bytes


def test_a_larger_card_gets_more_layers_and_the_rooms_are_even():
    spec = load_model_spec("qwen2.5-32b")
    s = TrainSetup(micro_batch=1, seq_len=2048, method="qlora", checkpointing=True, loss_kernel="chunked")
    even = estimate(spec, s.but(split_over=(14 * GIB, 14 * GIB))).cards
    uneven = estimate(spec, s.but(split_over=(22 * GIB, 10 * GIB))).cards
    assert uneven[0]["layers"] > even[0]["layers"] > 0
    rooms = [c["budget_bytes"] - c["peak_bytes"] for c in uneven]
    per_layer = (uneven[0]["peak_bytes"] - uneven[1]["peak_bytes"]) / max(1, uneven[0]["layers"] - uneven[1]["layers"])
    assert abs(rooms[0] - rooms[1]) <= 2 * abs(per_layer) + GIB  # within about a layer's bytes of each other


def test_tied_embeddings_keep_the_head_on_the_first_card():
    spec = load_model_spec("llama-3.2-3b")  # tied
    s = TrainSetup(micro_batch=1, seq_len=2048, method="qlora", checkpointing=True, loss_kernel="chunked")
    cards = estimate(spec, s.but(split_over=(8 * GIB, 8 * GIB))).cards
    assert cards[0]["holds_head"] and not cards[1]["holds_head"]
    assert cards[0]["breakdown"].get("logits_loss") and not cards[1]["breakdown"].get("logits_loss")


def test_the_counts_you_set_are_kept_and_bad_ones_named():
    plan = plan_run(cfg(**{"distributed.num_gpus": 3, "distributed.layer_split": True,
                           "distributed.layers_per_gpu": [20, 22, 22]}), snap(TRIPLE))
    assert [e["layers"] for e in plan.gpus] == [20, 22, 22]
    assert "distributed.layers_per_gpu" not in plan.settings  # yours, not the planner's
    with pytest.raises(UserError, match=r"distributed.layers_per_gpu: \[20, 22, 20\] adds up to 62 .* has 64"):
        plan_run(cfg(**{"distributed.num_gpus": 3, "distributed.layer_split": True,
                        "distributed.layers_per_gpu": [20, 22, 20]}), snap(TRIPLE))


@pytest.mark.parametrize("dotted, field, words", [
    ({"distributed.layer_split": True, "distributed.num_gpus": 2, "method.type": "full"}, "distributed.layer_split",
     "not with a full fine-tune"),
    ({"distributed.layer_split": True}, "distributed.layer_split", "one card"),
    ({"distributed.layer_split": True, "distributed.num_gpus": 2, "distributed.layers_per_gpu": [32, 16, 16]},
     "distributed.layers_per_gpu", "lists 3 count(s) but the layers are split over 2"),
    ({"distributed.layer_split": False, "distributed.layers_per_gpu": [32, 32]}, "distributed.layers_per_gpu",
     "layer_split is false"),
])
def test_bad_split_settings_are_refused_naming_the_key(dotted, field, words):
    with pytest.raises(C.ConfigError) as exc:
        cfg(**dotted)
    text = str(exc.value)
    assert field in text and words in text, text


def test_the_cli_refuses_bad_counts_with_exit_2_and_writes_nothing(tmp_path):
    import subprocess
    import sys

    import yaml

    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"model": {"architecture": "qwen2.5-32b"}, "method": {"type": "qlora"},
                                    "training": {"effective_batch_size": 8},
                                    "distributed": {"num_gpus": 3, "layer_split": True,
                                                    "layers_per_gpu": [1, 1, 1]}}))
    proc = subprocess.run([sys.executable, "-m", "trainer", "plan", str(path), "--hardware", str(TRIPLE)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "distributed.layers_per_gpu" in proc.stderr and "adds up to 3" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]


# -- the worker's device_map on a real model ---------------------------------------------------------------------
def _tiny(tied: bool):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    conf = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    return LlamaForCausalLM(conf)


@pytest.mark.parametrize("tied", [False, True])
def test_the_device_map_places_every_module_as_planned(tied):
    from trainer.worker.loading import device_map

    model = _tiny(tied)
    placed = device_map.split_map(model, [1, 3], ["cuda:0", "cuda:1"])
    assert placed["model.embed_tokens"] == "cuda:0"
    assert [placed[f"model.layers.{i}"] for i in range(4)] == ["cuda:0", "cuda:1", "cuda:1", "cuda:1"]
    assert placed["model.norm"] == "cuda:1"
    assert placed["lm_head"] == ("cuda:0" if tied else "cuda:1")
    # every parameter and buffer is under exactly one entry
    for name, _ in [*model.named_parameters(), *model.named_buffers()]:
        owners = [k for k in placed if name == k or name.startswith(k + ".")]
        assert len(owners) == 1, (name, owners)
    with pytest.raises(UserError, match="layers_per_gpu"):
        device_map.split_map(model, [1, 2], ["cuda:0", "cuda:1"])
    assert device_map.even_counts(64, 3) == [22, 21, 21]


def test_a_split_model_trains_through_accelerates_hooks_with_the_unsplit_loss():
    """The split model dispatched by accelerate (its hooks moving each module's input to its device; two 'cards'
    that are both the CPU here) computes the same loss and gradients as the model in one piece, through the
    chunked loss that reads the head's weight itself."""
    import copy

    import torch

    from trainer.worker.kernels.chunked_loss import chunked_causal_lm_loss
    from trainer.worker.loading import device_map

    one = _tiny(tied=True)
    split = device_map.dispatch(copy.deepcopy(one), device_map.split_map(one, [2, 2], ["cpu", "cpu"]))
    assert getattr(split, "hf_device_map", None)
    ids = torch.randint(0, 96, (2, 12))
    losses = []
    for model in (one, split):
        hidden = model.model(input_ids=ids).last_hidden_state
        loss = chunked_causal_lm_loss(hidden, model.lm_head, ids, vocab=96)
        loss.backward()
        losses.append((loss.detach(), model.model.layers[0].mlp.down_proj.weight.grad.clone()))
    assert torch.allclose(losses[0][0], losses[1][0])
    assert torch.allclose(losses[0][1], losses[1][1])


def test_the_exported_scripts_run_the_split_on_its_cards_and_split_anew_on_another_count():
    from trainer.launch.export_scripts import launch_texts

    plan = plan_run(cfg(), snap(TRIPLE))
    texts = launch_texts(plan.resolved)
    cards = ",".join(plan.resolved.distributed.gpus)
    assert f"export CUDA_VISIBLE_DEVICES={cards}" in texts["launch.sh"]  # one process sees both cards
    assert "--set distributed.layers_per_gpu=auto" in texts["launch_multi_gpu.sh"]
    assert "layers split over several GPUs" in texts["launch_multi_gpu.sh"]
    # the counts given way to 'auto' on three cards: the config the script runs is valid there
    three = C.replace(plan.resolved, **{"distributed.num_gpus": 3, "distributed.gpus": "auto",
                                         "distributed.layers_per_gpu": "auto"})
    assert three.distributed.layer_split is True and three.world_size == 1
