"""Configuration: the typed, frozen tree whose sections check their own fields (``schema``; the sections in
``training``, ``inputs`` and ``run``), recipes to Config
(``loading``), the rules spanning sections (``checks``). Standard library and PyYAML only: what a recipe names
outside itself (files, models, packages, code) is checked by ``dtppo.launch.preflight``."""

from dtppo.config.checks import batch_clamp_notes, check_sft
from dtppo.config.inputs import (
    TASK_VERIFIERS,
    CarelessStageConfig,
    DataConfig,
    DatasetConfig,
    EnvConfig,
    RewardConfig,
    RewardModelConfig,
    SFTConfig,
    TinyMathConfig,
)
from dtppo.config.loading import apply_overrides, from_dict, load
from dtppo.config.rules import ConfigError
from dtppo.config.run import (
    CheckpointingConfig,
    ClusterConfig,
    ExportConfig,
    LoggerConfig,
    MlflowConfig,
    WandbConfig,
)
from dtppo.config.schema import Config
from dtppo.config.training import (
    DynamicSamplingConfig,
    GenerationConfig,
    LoraConfig,
    LossAggregation,
    LossConfig,
    ModelConfig,
    OptimizerConfig,
    OverlongShapingConfig,
    ParallelConfig,
    PolicyConfig,
    PPOConfig,
    SchedulerConfig,
    TinyModelConfig,
    ValueConfig,
)

__all__ = [
    "TASK_VERIFIERS",
    "apply_overrides",
    "check_sft",
    "batch_clamp_notes",
    "from_dict",
    "load",
    "CarelessStageConfig",
    "CheckpointingConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "DatasetConfig",
    "DynamicSamplingConfig",
    "EnvConfig",
    "ExportConfig",
    "GenerationConfig",
    "LoggerConfig",
    "LoraConfig",
    "LossAggregation",
    "LossConfig",
    "MlflowConfig",
    "ModelConfig",
    "OptimizerConfig",
    "OverlongShapingConfig",
    "PPOConfig",
    "ParallelConfig",
    "PolicyConfig",
    "RewardConfig",
    "RewardModelConfig",
    "SFTConfig",
    "SchedulerConfig",
    "TinyMathConfig",
    "TinyModelConfig",
    "ValueConfig",
    "WandbConfig",
]
