"""The run config, split by job: the typed sections (``sections``), the checks that span fields (``cross_checks``),
reading, overrides and validation (``loading``), bad input in words (``messages``), every field for the
reference and the form (``fields``), presets (``presets``), the README reference (``docgen``) and where
AdamW's states live (``placements``: the one table of ``training.optimizer`` values).
``trainer.config`` itself re-exports the public names."""
from trainer.config.cross_checks import cross_check  # noqa: F401
from trainer.config.messages import ConfigError, known_keys  # noqa: F401
from trainer.config.fields import field_docs  # noqa: F401
from trainer.config.loading import (  # noqa: F401
    LEGACY_KEYS,
    apply_overrides,
    dump_yaml,
    explicit_keys,
    find_tokens,
    load,
    parse_override,
    read_yaml,
    replace,
    to_dict,
    validate,
)
from trainer.config.sections import (  # noqa: F401
    DETECTED,
    PLANNED_FOR_GRPO,
    PLANNED_GPUS,
    PLANNED_SPLIT,
    SCHEMA_VERSION,
    YOUR_SETTINGS,
    Auto,
    CheckpointConfig,
    DataConfig,
    DeepSpeedConfig,
    DistributedConfig,
    GrpoConfig,
    MethodConfig,
    ModelConfig,
    OutputConfig,
    RecoveryConfig,
    RewardsConfig,
    RunConfig,
    SpeedConfig,
    TrainingConfig,
)
