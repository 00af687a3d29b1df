"""The run-config schema: every problem at once, with field paths and fixes; exact round trips."""
from pathlib import Path

import pytest
import yaml

from trainer import config as c


def problems(data):
    with pytest.raises(c.ConfigError) as info:
        c.validate(data)
    return dict(info.value.problems)


def test_defaults_validate_and_round_trip_exactly():
    cfg = c.validate({})
    again = c.validate(yaml.safe_load(c.dump_yaml(cfg)))
    assert again == cfg
    assert c.dump_yaml(again) == c.dump_yaml(cfg)


REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("path", sorted((REPO / "configs").rglob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_validate_and_round_trip(path):
    cfg = c.load(path)
    assert c.validate(yaml.safe_load(c.dump_yaml(cfg))) == cfg


def test_the_configs_users_copy_live_in_configs_at_the_top_level():
    """The presets and the demo config are read from configs/ (a wheel carries it as trainer/configs: setup.py and
    tests/test_wheel_install.py); no config is left among the package data the code reads."""
    from trainer.core.paths import CONFIGS_DIR, DEMO_CONFIG, PRESETS_DIR, RESOURCES_DIR

    assert CONFIGS_DIR == REPO / "configs" and PRESETS_DIR.parent == CONFIGS_DIR and DEMO_CONFIG.parent == CONFIGS_DIR
    assert (PRESETS_DIR / "laptop_16gb.yaml").is_file() and DEMO_CONFIG.is_file()
    assert not list(RESOURCES_DIR.rglob("*.yaml"))


def test_all_errors_reported_at_once_with_paths():
    found = problems({"training": {"micro_batch_size": 0, "learning_rate": "fast", "effective_batch_size": -4},
                      "speed": {"precision": "bf17"}, "trainig": {}})
    assert set(found) == {"training.micro_batch_size", "training.learning_rate", "training.effective_batch_size",
                          "speed.precision", "trainig"}
    assert "did you mean 'training'" in found["trainig"]
    assert "'bf16'" in found["speed.precision"]


def test_key_in_wrong_section_is_pointed_to():
    assert "data.seq_len" in problems({"seq_len": 512})["seq_len"]


def test_effective_batch_must_divide():
    msg = problems({"training": {"micro_batch_size": 3, "effective_batch_size": 16}})["training.effective_batch_size"]
    assert "not divisible" in msg and "3" in msg


def test_inconsistent_accumulation_named_with_fix():
    msg = problems({"training": {"micro_batch_size": 2, "gradient_accumulation_steps": 3, "effective_batch_size": 16}})
    assert "set it to 8" in msg["training.gradient_accumulation_steps"]


def test_world_size_counts_in_effective_batch():
    cfg = c.validate({"distributed": {"num_gpus": 2},
                      "training": {"micro_batch_size": 2, "gradient_accumulation_steps": 4, "effective_batch_size": 16}})
    assert cfg.world_size == 2
    problems({"distributed": {"num_gpus": 3}, "training": {"micro_batch_size": 2, "effective_batch_size": 16}})


def test_overrides_are_typed_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("training: {max_steps: 5}\n")
    cfg = c.load(p, ["training.learning_rate=1e-4", "speed.gradient_checkpointing=true", "model.source=./m"])
    assert cfg.training.learning_rate == 1e-4 and cfg.speed.gradient_checkpointing is True
    with pytest.raises(c.ConfigError, match="key.path=value"):
        c.load(p, ["nonsense"])


def test_yaml_syntax_error_names_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("training:\n  max_steps: 5\n    learning_rate: 1\n")
    with pytest.raises(c.ConfigError, match="line 3"):
        c.load(p)


def test_tokens_are_rejected_without_echo():
    token = "hf_" + "a1B2c3D4e5" * 3
    with pytest.raises(c.ConfigError) as info:
        c.validate({"model": {"source": token}})
    assert token not in str(info.value)


def test_field_docs_cover_every_leaf():
    keys = {row[0] for row in c.field_docs()}
    assert "training.micro_batch_size" in keys and "deepspeed.offload_params" in keys
    assert all(row[3] for row in c.field_docs()), "every field needs a description"


def test_readme_config_reference_is_generated_from_the_schema():
    from trainer.config.docgen import main

    readme = Path(__file__).parent.parent / "README.md"
    assert main([str(readme), "--check"]) == 0, "run: python -m trainer.config.docgen --write README.md"


def test_a_run_folder_older_than_a_planner_field_reads_as_it_ran(tmp_path):
    """A run folder written before ``speed.tiled_mlp`` existed resumes untiled (as it ran), not stopped at a field
    still 'auto'; a config that says 'auto' itself is still refused."""
    import yaml

    from trainer.config.loading import dump_yaml
    from trainer.config.resolved import load_resolved
    from trainer.core.errors import UserError

    cfg = c.validate({"device": "cpu", "speed": {"precision": "fp32", "gradient_checkpointing": False,
                                                  "activation_offload": False, "loss_kernel": "hf", "tiled_mlp": False},
                      "model": {"dtype": "float32"}, "method": {"lora_dropout": 0.05},
                      "training": {"micro_batch_size": 2, "gradient_accumulation_steps": 8},
                      "deepspeed": {"enabled": False}, "distributed": {"launcher": "single"},
                      "recovery": {"ladder_keeps": []}})
    data = yaml.safe_load(dump_yaml(cfg))
    del data["speed"]["tiled_mlp"]
    old = tmp_path / "config.yaml"
    old.write_text(yaml.safe_dump(data), encoding="utf-8")
    assert load_resolved(old).speed.tiled_mlp is False
    data["speed"]["tiled_mlp"] = "auto"
    old.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(UserError, match="speed.tiled_mlp"):
        load_resolved(old)
