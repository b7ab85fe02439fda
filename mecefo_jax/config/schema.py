"""The config as typed, frozen sections, resolved and validated once per process.

`configs/*.py` build a ConfigDict on `mecefo_jax.config.base_config` (the one place
defaults live); every entry point resolves it once (`mecefo_jax/config_resolve.py`,
rules in `mecefo_jax/config_rules.py`), before any process, device or file is touched,
so an error names the field and the fix, and the code reads only typed fields and never
re-supplies defaults. The bottom layer: imports no other module of the project.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any


class ConfigError(ValueError):
    """A config field with a bad value; the message names the field and the fix."""


# A field that is a count of steps or 'auto' (snapshot.every).
IntOrAuto = int | str


@dataclasses.dataclass(frozen=True)
class ModelSection:
    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden: int
    rope_theta: float
    norm_eps: float
    dtype: str
    attention: str
    scan_layers: bool
    remat_policy: str
    loss_chunk_tokens: int


@dataclasses.dataclass(frozen=True)
class DataSection:
    source: str
    tfds_name: str
    data_dir: str
    tfds_text_key: str
    text_files: str
    tokenizer_path: str
    cache_dir: str
    seq_len: int
    global_batch_size: int
    val_fraction: float
    seed: int


@dataclasses.dataclass(frozen=True)
class MeshSection:
    data: int
    model: int
    num_cpu_devices: int
    replicas: int


@dataclasses.dataclass(frozen=True)
class TrainSection:
    steps: int
    lr_schedule_steps: int
    learning_rate: float
    warmup_fraction: float
    final_lr_fraction: float
    b1: float
    b2: float
    eps: float
    weight_decay: float
    grad_clip: float
    flat_optimizer: bool
    ordered_reduction: bool
    seed: int
    log_every: int
    eval_every: int
    eval_batches: int
    checkpoint_every: int
    keep_checkpoints: int


# `mecefo.projection`: what the neighbour's FFN kernel gradient is projected onto.
PROJECTION_RULES = {
    'weights': "the kernel's top-r singular directions V (the paper's; lowrank_dense)",
    'gradient': "a range finder on the batch's own kernel gradient (sketched_dense)",
    'exact': 'no projection: the exact kernel gradient (an ablation, not a saving)',
    'none': 'no kernel gradient: its rows count as dropped for the FFN kernels (a rule)',
}


@dataclasses.dataclass(frozen=True)
class MecefoSection:
    rank: float  # an integral value > 1 is an absolute rank (see projections.resolve_rank)
    tau: int
    projection: str
    skip_attention: bool
    attention_top_blocks: int
    neighbour_weight: float
    trust_top_blocks: int
    refresh: str
    refresh_iters: int
    refresh_split_min_elements: int
    remat_ffn: bool


@dataclasses.dataclass(frozen=True)
class FaultSection:
    strategy: str
    events: str
    regime: str
    regime_replicas: int
    mtbf_hours: float
    mttr_hours: float
    step_time_sec: float
    time_model: str
    allreduce_exposed: float
    seed: int
    max_concurrent: int
    max_neighbour_rows: int
    checkpoint_every: int
    relaunch_delay_sec: float


@dataclasses.dataclass(frozen=True)
class SnapshotSection:
    every: IntOrAuto
    overhead_budget_pct: float
    slots: int
    shard: bool
    parity: str
    parity_group: int


@dataclasses.dataclass(frozen=True)
class LaunchSection:
    local_devices: int
    heartbeat_timeout_sec: float
    start_timeout_sec: float
    stall_timeout_sec: float
    stop_timeout_sec: float
    kill: str
    return_after_steps: int
    recovery: str
    max_relaunches: int
    compilation_cache: str
    compile_ahead: bool
    standby_workers: bool
    object_store_mb: int
    accept_node_loss: bool


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole run's config: one frozen section per `base_config` section, same field order.

    What each field means is commented once, in mecefo_jax/config/defaults.py.
    """
    model: ModelSection
    data: DataSection
    mesh: MeshSection
    train: TrainSection
    mecefo: MecefoSection
    fault: FaultSection
    snapshot: SnapshotSection
    launch: LaunchSection

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """What `ConfigDict.to_json_best_effort(indent=2)` gives: the workdir's config.json."""
        return json.dumps(self.to_dict(), indent=2)


SECTIONS: dict[str, type] = {'model': ModelSection, 'data': DataSection, 'mesh': MeshSection,
                             'train': TrainSection, 'mecefo': MecefoSection, 'fault': FaultSection,
                             'snapshot': SnapshotSection, 'launch': LaunchSection}
