"""Configuration: the typed, frozen tree whose sections check their own fields (``schema``; one module per kind of
section: ``models``, ``optim``, ``generation``, ``policy``, ``value``, ``ppo``, ``loss``, ``inputs``, ``reward``,
``run``),
recipes to Config (``loading``, old key names through ``renames``), the rules spanning sections (``checks``).
Standard library and PyYAML only: what a recipe names outside itself (files, models, packages, code) is checked
by ``dtppo.launch.preflight``."""

from dtppo.config.checks import batch_clamp_notes, check_sft
from dtppo.config.generation import GenerationConfig
from dtppo.config.inputs import (
    TASK_VERIFIERS,
    CarelessStageConfig,
    DataConfig,
    DatasetConfig,
    EnvConfig,
    SFTConfig,
    TinyMathConfig,
)
from dtppo.config.loading import apply_overrides, from_dict, load
from dtppo.config.loss import KLConfig, LossAggregation, LossConfig, RolloutCorrectionConfig
from dtppo.config.models import LoraConfig, ModelConfig, ParallelConfig, TinyModelConfig
from dtppo.config.optim import OptimizerConfig, SchedulerConfig
from dtppo.config.policy import PolicyConfig
from dtppo.config.ppo import (
    DynamicSamplingConfig,
    GAEConfig,
    OverlongShapingConfig,
    PPOConfig,
    ValidationConfig,
)
from dtppo.config.renames import RENAMES
from dtppo.config.reward import ProcessModelConfig, RewardConfig, RewardModelConfig
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
from dtppo.config.value import ValueConfig, VtraceConfig, WarmupConfig

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
    "GAEConfig",
    "GenerationConfig",
    "KLConfig",
    "LoggerConfig",
    "LoraConfig",
    "LossAggregation",
    "LossConfig",
    "MlflowConfig",
    "ModelConfig",
    "OptimizerConfig",
    "OverlongShapingConfig",
    "PPOConfig",
    "ProcessModelConfig",
    "ParallelConfig",
    "RENAMES",
    "PolicyConfig",
    "RewardConfig",
    "RewardModelConfig",
    "RolloutCorrectionConfig",
    "SFTConfig",
    "SchedulerConfig",
    "TinyMathConfig",
    "TinyModelConfig",
    "ValidationConfig",
    "ValueConfig",
    "VtraceConfig",
    "WandbConfig",
    "WarmupConfig",
]
