"""How many ranks wrote a checkpoint whose marker predates ``world_size`` (trainer/rundir/checkpoints.py
``saved_ranks``): read off DeepSpeed ZeRO's per-rank optimizer partitions or HF's per-rank random states, so a resume
onto another number of GPUs is seen as one (the engine switch converts a ZeRO checkpoint, the accumulation is split
anew). The file names are the libraries' own (DeepSpeed's ``_get_zero_ckpt_name``, HF's ``_save_rng_state``)."""
from __future__ import annotations

import json

from trainer import config as C
from trainer.rundir.checkpoints import MARKER, engine_change, ranks_change, read_marker, saved_ranks

OLD_MARKER = {"step": 2, "micro_batch_size": 2, "gradient_accumulation_steps": 2, "effective_batch_size": 8,
              "deepspeed": True, "zero_stage": 2, "offload_optimizer": False, "optimizer": "adamw"}


def _checkpoint(tmp_path, files, marker=OLD_MARKER):
    ckpt = tmp_path / "checkpoint-2"
    for name in files:
        (ckpt / name).parent.mkdir(parents=True, exist_ok=True)
        (ckpt / name).write_bytes(b"")
    (ckpt / MARKER).write_text(json.dumps(marker))
    return ckpt


def test_zero_partitions_and_rng_states_say_how_many_ranks_saved(tmp_path):
    zero = _checkpoint(tmp_path / "a", ["global_step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                        "global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
                                        "global_step2/zero_pp_rank_0_mp_rank_00_model_states.pt", "rng_state_0.pth",
                                        "rng_state_1.pth"])
    assert saved_ranks(zero) == 2 and read_marker(zero)["world_size"] == 2
    fp32 = _checkpoint(tmp_path / "b", [f"global_step2/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(3)])
    assert saved_ranks(fp32) == 3
    ddp = _checkpoint(tmp_path / "c", ["optimizer.pt", "rng_state_0.pth", "rng_state_1.pth"],
                      dict(OLD_MARKER, deepspeed=False, zero_stage=None))
    assert saved_ranks(ddp) == 2
    one = _checkpoint(tmp_path / "d", ["optimizer.pt", "rng_state.pth"], dict(OLD_MARKER, deepspeed=False))
    assert saved_ranks(one) == 1
    bare = _checkpoint(tmp_path / "e", ["optimizer.pt"])
    assert saved_ranks(bare) is None and "world_size" not in read_marker(bare)
    recorded = _checkpoint(tmp_path / "f", ["rng_state_0.pth", "rng_state_1.pth"], dict(OLD_MARKER, world_size=4))
    assert read_marker(recorded)["world_size"] == 4  # what the marker records wins


def test_an_old_zero_checkpoint_resumed_on_one_gpu_is_converted_and_its_batch_split_anew(tmp_path):
    """Without the inference the old marker counted as the run's own number of ranks: DeepSpeed's loader would have
    been asked to read 2 ranks' partitions on 1 and the accumulation change would go unsaid."""
    ckpt = _checkpoint(tmp_path, [f"global_step2/bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(2)])
    cfg = C.validate({"model": {"architecture": "tiny-llama"}, "deepspeed": {"enabled": True, "zero_stage": 2},
                      "training": {"effective_batch_size": 8, "micro_batch_size": 2, "gradient_accumulation_steps": 4}})
    change = engine_change(read_marker(ckpt), cfg)
    assert change is not None and change["from"].endswith("on 2 GPUs") and change["to"].endswith("on 1 GPU")
    ranks = ranks_change(read_marker(ckpt), cfg)
    assert ranks["message"] == "resumed on 1 GPU (was 2): accumulation 2 → 4, effective batch 8 kept"
