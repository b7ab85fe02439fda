"""Every config field, declared once: its default, its type, its rules and what it means.

Each section is a frozen dataclass; each field is `field(default, help, *rules)`.
From these declarations come both forms a config takes: the ml_collections
ConfigDict that `configs/*.py` edit and `--config.section.field=value` overrides
(`base_config`), and the typed, checked `Config` the code reads (`resolve.py`). A
rule names what the field must be and a value that fixes it (the default, unless
it says otherwise); a rule that spans fields is a function in `CROSS_RULES`. No
other module supplies a default or checks a field again.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, NamedTuple

from mecefo_jax.failure_schedule import REGIMES, parse_events, validate_events


class ConfigError(ValueError):
    """A config field with a bad value; the message names the field and the fix."""


class Rule(NamedTuple):
    """What a field's value must satisfy (`holds`), said as `says`, and a value that fixes it."""
    holds: Callable[[Any], bool]
    says: str
    fix: Any = None  # None: the field's default


def at_least(bound, fix=None, says: str = '') -> Rule:
    return Rule(lambda v: v >= bound, says or f'must be >= {bound}', fix)


def above(bound, says: str = '', fix=None) -> Rule:
    return Rule(lambda v: v > bound, says or f'must be > {bound}', fix)


def within(lo, hi, says: str, *, open_top: bool = False, fix=None) -> Rule:
    return Rule((lambda v: lo <= v < hi) if open_top else (lambda v: lo <= v <= hi), says, fix)


def one_of(choices, fix=None) -> Rule:
    choices = tuple(choices)
    return Rule(lambda v: v in choices, 'must be one of ' + ', '.join(map(repr, choices)),
                choices[0] if fix is None else fix)


def step_window(text: str) -> tuple[int, int] | None:
    """(START, STOP) of a 'START:STOP' step range (`train.profile_steps`); None where malformed."""
    start, colon, stop = text.partition(':')
    try:
        first, end = int(start), int(stop)
    except ValueError:
        return None
    return (first, end) if colon and 0 <= first < end else None


def field(default, help: str, *rules: Rule):  # noqa: A002 (the word its readers use)
    return dataclasses.field(default=default, metadata={'help': help, 'rules': rules})


# The values some fields choose between, with what each means.
DTYPES = ('float32', 'bfloat16')
ATTENTION_IMPLEMENTATIONS = ('auto', 'xla', 'cudnn')
REMAT_POLICIES = {
    'none': 'no rematerialisation: every activation of the block is kept',
    'full': 'only the block input is kept; the whole block is recomputed',
    'save_attention': 'q, k, v and the attention context are kept; the FFN is recomputed',
    'save_dots': 'every matmul output without batch dims is kept (XLA dots_saveable family)',
}
DATA_SOURCES = ('embedded', 'python_docs', 'tfds', 'text')
PROJECTION_RULES = {
    'weights': "the kernel's top-r singular directions V (the paper's; lowrank_dense)",
    'gradient': "a range finder on the batch's own kernel gradient (sketched_dense)",
    'exact': 'no projection: the exact kernel gradient (an ablation, not a saving)',
    'none': 'no kernel gradient: its rows count as dropped for the FFN kernels (a rule)',
}
# `fault.strategy`: the strategies, in the order reports list them (`faults/strategies.py`
# says what each does); controls are experiments' baselines, valid but never the default list.
STRATEGIES = ('mecefo', 'mecefo_planned', 'ndb_naive', 'elastic', 'drop', 'checkpoint_restart')
CONTROLS = ('drop_adopters',)
TIME_MODELS = ('steps', 'wall_clock')
# mecefo.refresh_split_min_elements, named: the refresh's cost model (studies/refresh_costs.py)
# prices the same default.
DEFAULT_SPLIT_MIN_ELEMENTS = 1 << 18
PARITY_CODES = ('', 'xor')
RECOVERIES = ('memory', 'disk')


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """The LLaMA shape and how it is computed."""
    vocab_size: int = field(512, 'tokenizer and embedding size; a trained tokenizer must match',
                            at_least(1))
    d_model: int = field(64, 'residual width d', at_least(1))
    num_layers: int = field(2, 'transformer blocks', at_least(1))
    num_heads: int = field(4, 'query heads; must divide d_model', at_least(1))
    num_kv_heads: int = field(4, 'key/value heads (grouped-query attention when < num_heads)',
                              at_least(1))
    ffn_hidden: int = field(172, 'SwiGLU hidden width h', at_least(1))
    rope_theta: float = field(10000.0, 'rotary embedding base', above(0))
    norm_eps: float = field(1e-6, 'RMSNorm epsilon', above(0))
    dtype: str = field('float32', 'compute dtype: float32 on CPU, bfloat16 on GPU (params stay '
                       'float32)', one_of(DTYPES))
    attention: str = field('auto', "'auto' (cuDNN fused on GPU with bfloat16, else XLA) | 'xla' | "
                           "'cudnn'", one_of(ATTENTION_IMPLEMENTATIONS))
    scan_layers: bool = field(True, 'nn.scan over blocks: compile time does not grow with depth')
    remat_policy: str = field('none', 'block remat: ' + ' | '.join(REMAT_POLICIES),
                              one_of(REMAT_POLICIES))
    loss_chunk_tokens: int = field(4096, 'cross-entropy chunk (tokens); bounds the live logits')


@dataclasses.dataclass(frozen=True)
class DataSection:
    """Where documents come from and how they are batched."""
    source: str = field('embedded', "'embedded' (CPython's docs, offline) | 'python_docs' | "
                        "'tfds' | 'text'", one_of(DATA_SOURCES))
    tfds_name: str = field('c4/en', "TFDS dataset name when source='tfds'")
    data_dir: str = field('', "local TFDS data_dir (required for source='tfds')")
    tfds_text_key: str = field('text', 'feature holding the document text in TFDS records')
    text_files: str = field('', "comma-separated files or globs when source='text'")
    tokenizer_path: str = field('', "sentencepiece .model; '' trains one on the train split "
                                'and caches it')
    cache_dir: str = field('~/.cache/mecefo_jax', 'where trained tokenizers are cached',
                           Rule(bool, 'must name a directory'))
    seq_len: int = field(64, 'tokens per training sequence', at_least(1))
    global_batch_size: int = field(16, 'sequences per step, split evenly over the replicas',
                                   at_least(1))
    val_fraction: float = field(0.05, 'documents held out for validation (embedded/text sources)',
                                within(0.0, 1.0, 'must be in [0, 1): the fraction of documents '
                                       'held out for validation', open_top=True))
    seed: int = field(0, 'shuffle seed; the sample order depends on nothing else')


@dataclasses.dataclass(frozen=True)
class MeshSection:
    """The (data, model) device mesh."""
    data: int = field(-1, 'data-parallel replicas; -1 uses every device left over by mesh.model',
                      Rule(lambda v: v == -1 or v >= 1,
                           'must be -1 (every device left over by mesh.model) or >= 1'))
    model: int = field(1, 'tensor-parallel width (shards heads and FFN hidden)', at_least(1))
    num_cpu_devices: int = field(8, 'with no accelerator, simulate this many CPU devices',
                                 at_least(1))
    replicas: int = field(0, 'simulate R data-parallel replicas as rows on the mesh (R > 0): a '
                          'failure then changes roles of rows, never the mesh, and one device can '
                          'hold a 32-replica cluster (docs/usage.md); 0: one replica per data row. '
                          'Single-process jobs only',
                          at_least(0, says='must be >= 0 (0: one replica per data row of the mesh)'))


@dataclasses.dataclass(frozen=True)
class TrainSection:
    """Optimizer (the paper's AdamW), schedule and cadences."""
    steps: int = field(200, 'optimizer steps', at_least(1))
    lr_schedule_steps: int = field(0, 'steps the warmup + cosine schedule spans (0: train.steps); '
                                   'past them the LR stays at its final value', at_least(0))
    learning_rate: float = field(3e-3, 'peak learning rate after warmup', above(0))
    warmup_fraction: float = field(0.1, 'linear warmup over this fraction of steps',
                                   within(0.0, 1.0, 'must be in [0, 1]'))
    final_lr_fraction: float = field(0.1, 'cosine decays to this fraction of the peak', at_least(0))
    b1: float = field(0.9, 'AdamW beta1 (paper)', within(0.0, 1.0, 'must be in [0, 1)', open_top=True))
    b2: float = field(0.999, 'AdamW beta2 (paper)',
                      within(0.0, 1.0, 'must be in [0, 1)', open_top=True))
    eps: float = field(1e-8, 'AdamW epsilon (paper)', above(0))
    weight_decay: float = field(0.01, 'AdamW decoupled weight decay (paper)', at_least(0))
    grad_clip: float = field(1.0, 'global-norm clipping; 0 disables', at_least(0))
    flat_optimizer: bool = field(False, "Adam's moments as one vector (optax.flatten): one fused "
                                 'update instead of one per leaf; needs mesh.model=1')
    ordered_reduction: bool = field(False, "sum the replicas' gradients in one fixed order "
                                    '(gather, then sum): bit for bit the same in one process and '
                                    'across processes, for verification runs')
    seed: int = field(0, 'parameter init seed')
    log_every: int = field(10, 'steps between metrics rows', at_least(1))
    eval_every: int = field(100, 'steps between validation evals; 0 disables periodic eval',
                            at_least(0))
    eval_batches: int = field(4, 'validation batches per eval', at_least(1))
    checkpoint_every: int = field(100, 'steps between Orbax checkpoints; 0 disables', at_least(0))
    keep_checkpoints: int = field(2, 'checkpoints kept on disk', at_least(1))
    tensorboard: bool = field(True, "TensorBoard summaries under <workdir>/tensorboard by process 0 (metrics.jsonl's "
                              'scalars and the fault story; `tensorboard --logdir <workdir>`); False: none')
    profile_steps: str = field('', "'START:STOP': a jax.profiler trace of steps START to STOP - 1 into "
                               "<workdir>/tensorboard (TensorBoard's profile plugin, Perfetto); '' none",
                               Rule(lambda v: v == '' or step_window(v) is not None,
                                    "must be '' or 'START:STOP' with 0 <= START < STOP"))
    init_from: str = field('', 'a Hugging Face LlamaForCausalLM directory (scripts/hf_export.py) a new run '
                           'starts from: its weights, a fresh optimizer; a resumed run ignores it')


@dataclasses.dataclass(frozen=True)
class MecefoSection:
    """MeCeFO's neighbour backward (Hu et al., NeurIPS 2025) and this project's rules around it."""
    rank: float = field(0.25, 'low-rank r: a whole rank >= 1, or a fraction in (0, 1] of '
                        'min(in, out)', Rule(lambda v: v > 0 and (v <= 1.0 or float(v).is_integer()),
                                             'must be a fraction in (0, 1] or a whole rank >= 1'))
    tau: int = field(100, 'refresh the projections every tau steps while a neighbour is active '
                     '(paper: 100)', at_least(1, says='must be >= 1 (steps between SVD refreshes)'))
    projection: str = field('weights', "what a neighbour's FFN kernel gradient is projected onto: "
                            + '; '.join(f"'{k}': {v}" for k, v in PROJECTION_RULES.items()),
                            one_of(PROJECTION_RULES))
    skip_attention: bool = field(True, "the neighbour's attention branch is identity in backward "
                                 "(the paper's rule); False computes it exactly (an ablation)")
    attention_top_blocks: int = field(0, 'the top K blocks still compute their attention backward '
                                      "exactly (a rule); 0: the paper's")
    neighbour_weight: float = field(1.0, "the weight of a neighbour-mode row's gradient where it "
                                    "is trusted: 1.0 the paper's rule, 0.0 the row counts as dropped",
                                    within(0.0, 1.0, "must be in [0, 1] (1: the paper's rule, 0: "
                                           'the row counts as dropped)'))
    trust_top_blocks: int = field(0, 'trust the neighbour in the top K blocks, the final norm and '
                                  'the head only (below, its rows count as dropped); 0: every block')
    refresh: str = field('subspace', "how V is refreshed: 'subspace' (randomized subspace "
                         "iteration warm-started from the held V) | 'svd' (exact, the reference)",
                         one_of(('subspace', 'svd')))
    refresh_iters: int = field(3, 'subspace iterations per refresh (three keep >= 0.99 of the '
                               'top-r energy at 7B shapes; scripts/bench_refresh.py)', at_least(1))
    refresh_split_min_elements: int = field(
        DEFAULT_SPLIT_MIN_ELEMENTS, "kernels with at least this many elements per layer split the refresh's products "
        "over 'data'; smaller ones refresh whole on every replica; 0 splits every kernel",
        at_least(0, says='must be >= 0 (0 splits every kernel)'))
    remat_ffn: bool = field(False, "recompute the neighbour's FFN activations in backward (the "
                            "paper's rule 3); off: +19% FLOPs for a peak that already fits "
                            '(docs/algorithm.md section 6)')


@dataclasses.dataclass(frozen=True)
class FaultSection:
    """Which replicas fail when, and the strategy that absorbs it."""
    strategy: str = field('drop', 'how failed replicas are absorbed: ' + ' | '.join(STRATEGIES)
                          + "; 'drop' reached the fault-free loss soonest at the verdict's "
                          'paper_like point (docs/verdict.md)', one_of(STRATEGIES + CONTROLS))
    events: str = field('', "explicit failures 'step:replica:duration,...'; overrides regime")
    regime: str = field('', "'' | low | mid | high: the paper's MTBF/MTTR presets",
                        Rule(lambda v: v.strip().lower() in ('',) + tuple(sorted(REGIMES)),
                             'must be one of ' + ', '.join(map(repr, ('',) + tuple(sorted(REGIMES)))),
                             "''"))
    regime_replicas: int = field(0, 'the regime MTBF is for this many replicas (paper: 32); '
                                 '0: as is', at_least(0))
    mtbf_hours: float = field(0.0, 'custom cluster-wide mean time between failures (with '
                              'mttr_hours)', at_least(0))
    mttr_hours: float = field(0.0, 'custom mean time to recovery', at_least(0))
    step_time_sec: float = field(60.0, 'cluster seconds per step: converts hours to steps',
                                 above(0, 'must be > 0 (cluster seconds per step)'))
    time_model: str = field('steps', "how failures meet the steps: 'steps' (an outage lasts the "
                            "same steps under every strategy) | 'wall_clock' (each step advances "
                            "the trace by step_time_sec x its layout's step ratio: "
                            'faults/step_clock.py)', one_of(TIME_MODELS))
    allreduce_exposed: float = field(0.0, 'wall_clock: the exposed share of the gradient '
                                     'all-reduce in a fault-free step; it dilutes a slower '
                                     'step: c_eff = 1 + (c - 1)(1 - allreduce_exposed)',
                                     within(0.0, 1.0, 'must be in [0, 1): the exposed share of the '
                                            'all-reduce in a fault-free step', open_top=True))
    seed: int = field(0, 'seed of the random failure process (identical on every host)')
    max_concurrent: int = field(0, 'cap on replicas down at once; 0 = all but one', at_least(0))
    max_neighbour_rows: int = field(0, 'mecefo_planned: at most this many rows per step in '
                                    'neighbour mode; 0: no cap', at_least(0))
    checkpoint_every: int = field(10, 'checkpoint_restart: save period in steps', at_least(1))
    relaunch_delay_sec: float = field(120.0, 'checkpoint_restart: modelled job relaunch, '
                                      'reported apart', at_least(0))


@dataclasses.dataclass(frozen=True)
class SnapshotSection:
    """In-memory snapshots held by keeper processes under the launcher (REFT; docs/launch.md)."""
    every: int | str = field('auto', "steps between snapshots: 'auto' (the smallest interval "
                             'within overhead_budget_pct, measured again after a topology '
                             'change) | N | 0 (off)',
                             Rule(lambda v: v == 'auto' or v >= 0,
                                  "must be 'auto', 0 (off) or a number of steps >= 1", "'auto'"))
    overhead_budget_pct: float = field(2.0, 'snapshot.every=auto: most training slowdown, in %',
                                       above(0, 'must be a percentage > 0', 2))
    slots: int = field(3, 'snapshots each keeper holds (>= 3 so every worker shares a step)',
                       at_least(2))
    shard: bool = field(True, 'workers holding the same replicated state each write a different '
                        "1/n of it (REFT); a lost keeper's part comes back from parity")
    parity: str = field('xor', "'' | 'xor': erasure-code snapshots across keepers",
                        one_of(PARITY_CODES, "''"))
    parity_group: int = field(2, 'keepers per parity group (one lost member each recoverable)',
                              at_least(2, 4))


@dataclasses.dataclass(frozen=True)
class LaunchSection:
    """The launcher (python -m mecefo_jax.launch): worker processes, failures, relaunches."""
    local_devices: int = field(2, 'devices per worker: fake CPU devices, or GPUs where the node '
                               'has them', at_least(1))
    heartbeat_timeout_sec: float = field(20.0, "a worker that has not answered the launcher's "
                                         'progress requests this long counts as failed',
                                         above(0, 'must be > 0 seconds'))
    start_timeout_sec: float = field(1800.0, "no step completed this long after a generation's "
                                     'start: a hang', above(0, 'must be > 0 seconds'))
    stall_timeout_sec: float = field(600.0, 'no step completed anywhere this long (after the '
                                     "generation's first): restart it", above(0, 'must be > 0 seconds'))
    stop_timeout_sec: float = field(300.0, 'after SIGTERM or Ctrl-C, how long workers get to save '
                                    'before they are killed; also how long a generation gets to '
                                    'save and end after its last step', above(0, 'must be > 0 seconds'))
    kill: str = field('', "injected failures 'STEP:WORKER[:SIGNAL[:keeper|publish|snapshot]]', "
                      "'STEP:WORKER:node[:snapshot]' or 'STEP:launcher[:SIGNAL[:snapshot]]', "
                      'comma-separated (docs/launch.md, "Failures")')
    return_after_steps: int = field(0, 'a failed worker rejoins after this many steps; 0: never',
                                    at_least(0))
    recovery: str = field('memory', "'memory' (keepers; survivors go on) | 'disk' (Orbax; restart "
                          'all)', one_of(RECOVERIES))
    max_relaunches: int = field(8, 'give up after this many relaunches', at_least(0))
    compilation_cache: str = field('auto', "workers' persistent program cache: 'auto' "
                                   "(workdir/launch/xla_cache), a path, or '' (off)")
    compile_ahead: bool = field(True, 'after the first step, compile (niced) the programs the '
                                'survivors of every single-worker loss will need')
    object_store_mb: int = field(256, "Ray's object store per node of a local cluster the "
                                 "launcher starts: small, the keepers' snapshots live beside it",
                                 at_least(32))
    accept_node_loss: bool = field(False, 'run a placement where losing one node loses the only '
                                   'copy of part of the state (a lost node then means a disk '
                                   'restart)')


SECTIONS: dict[str, type] = {'model': ModelSection, 'data': DataSection, 'mesh': MeshSection,
                             'train': TrainSection, 'mecefo': MecefoSection, 'fault': FaultSection,
                             'snapshot': SnapshotSection, 'launch': LaunchSection}


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole run's config: one frozen section per `SECTIONS` entry, checked (`resolve`)."""
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


# ------------------------------------------------------------------ rules across fields

def require(ok: bool, dotted: str, value: Any, says: str, fix: Any) -> None:
    """ConfigError naming `dotted`, what it must be and the `--config.` flag that fixes it."""
    if not ok:
        shown = "''" if fix == '' else fix
        raise ConfigError(f'{dotted}={value!r}: {says}; set --config.{dotted}={shown}.')


def replicas_of(cfg: Config) -> int:
    """The data-parallel replicas the config fixes (mesh.replicas, else mesh.data; -1: the devices')."""
    return cfg.mesh.replicas or cfg.mesh.data


def _heads_divide(cfg: Config) -> None:
    m = cfg.model
    require(m.d_model % m.num_heads == 0, 'model.num_heads', m.num_heads,
            f'must divide model.d_model={m.d_model}', 'a divisor of d_model')
    require(m.num_heads % m.num_kv_heads == 0, 'model.num_kv_heads', m.num_kv_heads,
            f'must divide model.num_heads={m.num_heads}', m.num_heads)


def _batch_splits(cfg: Config) -> None:
    field_, replicas = ('mesh.replicas' if cfg.mesh.replicas else 'mesh.data'), replicas_of(cfg)
    batch = cfg.data.global_batch_size
    require(replicas < 1 or batch % replicas == 0, 'data.global_batch_size', batch,
            f'must be a multiple of {field_}={replicas}',
            max(replicas, batch // max(replicas, 1) * replicas))


def _flat_optimizer_unsplit(cfg: Config) -> None:
    require(not cfg.train.flat_optimizer or cfg.mesh.model == 1, 'train.flat_optimizer', True,
            f'needs mesh.model=1 (one flat vector cannot follow the tensor-parallel split of '
            f'mesh.model={cfg.mesh.model})', False)


def _blocks_within_depth(cfg: Config) -> None:
    layers = cfg.model.num_layers
    for name, meaning in (('attention_top_blocks', 'every block skips it'), ('trust_top_blocks', 'every block')):
        value = getattr(cfg.mecefo, name)
        require(0 <= value <= layers, f'mecefo.{name}', value,
                f'must be in [0, model.num_layers={layers}] (0: {meaning})', 0)


def _events_fit_the_run(cfg: Config) -> None:
    """`fault.events` syntax, steps inside the run, no overlaps; replicas too once known."""
    try:
        events = parse_events(cfg.fault.events)
        if events:
            # With mesh.data=-1 the replica count waits for the devices (the controller).
            replicas = replicas_of(cfg) if replicas_of(cfg) >= 1 else max(e.replica for e in events) + 1
            validate_events(events, num_replicas=replicas, total_steps=cfg.train.steps)
    except ValueError as error:
        raise ConfigError(f'{error} Set --config.fault.events=STEP:REPLICA:STEPS,...') from None


def _failure_process_whole(cfg: Config) -> None:
    f = cfg.fault
    require((f.mtbf_hours > 0) == (f.mttr_hours > 0), 'fault.mttr_hours', f.mttr_hours,
            f'must be > 0 exactly when fault.mtbf_hours={f.mtbf_hours} is (a custom failure '
            'process needs both; both 0 means none)', 'HOURS (or mtbf_hours=0)')
    require(f.time_model == 'wall_clock' or f.allreduce_exposed == 0.0, 'fault.allreduce_exposed',
            f.allreduce_exposed, "prices steps on the wall clock only: set fault.time_model='wall_clock'",
            0.0)
    require(f.max_neighbour_rows == 0 or f.strategy == 'mecefo_planned', 'fault.max_neighbour_rows',
            f.max_neighbour_rows, f'caps the plans of fault.strategy=mecefo_planned only, not '
            f'{f.strategy!r}', 0)


def _profile_within_run(cfg: Config) -> None:
    window = step_window(cfg.train.profile_steps)
    steps = cfg.train.steps
    require(window is None or window[1] <= steps, 'train.profile_steps', cfg.train.profile_steps,
            f'must end by train.steps={steps}', f"'{min(window[0], steps - 1) if window else 0}:{steps}'")


CROSS_RULES = (_heads_divide, _batch_splits, _flat_optimizer_unsplit, _blocks_within_depth,
               _events_fit_the_run, _failure_process_whole, _profile_within_run)


def check(cfg: Config) -> None:
    """Raises ConfigError naming the first bad field of `cfg` and how to fix it."""
    for name, cls in SECTIONS.items():
        section = getattr(cfg, name)
        for f in dataclasses.fields(cls):
            value = getattr(section, f.name)
            for rule in f.metadata['rules']:
                require(rule.holds(value), f'{name}.{f.name}', value, rule.says,
                        f.default if rule.fix is None else rule.fix)
    for rule in CROSS_RULES:
        rule(cfg)


# ------------------------------------------------------------------ the ConfigDict form

def base_config():
    """The ml_collections ConfigDict every `configs/*.py` starts from: one section each, every
    field at its default (configs override values, never add fields)."""
    from ml_collections import ConfigDict, config_dict
    cfg = ConfigDict()
    for name, cls in SECTIONS.items():
        section = cfg[name] = ConfigDict()
        for f in dataclasses.fields(cls):
            # A field of two types (snapshot.every: 'auto' or a step count) takes either.
            section[f.name] = (config_dict.FieldReference(f.default, field_type=object)
                               if f.type == 'int | str' else f.default)
    return cfg


def llama_config(*, d_model: int, num_layers: int, num_heads: int, ffn_hidden: int,
                 learning_rate: float):
    """A LLaMA shape (docs/algorithm.md) on C4 with the MeCeFO paper's AdamW settings.

    Sequence length, batch, steps, learning rate and rank are not given by
    the paper: these are our choices (docs/usage.md, Configs), shared by every size.
    """
    cfg = base_config()
    cfg.model.vocab_size = 32000  # LLaMA-sized sentencepiece vocab
    cfg.model.d_model = d_model
    cfg.model.num_layers = num_layers
    cfg.model.num_heads = num_heads
    cfg.model.num_kv_heads = num_heads  # plain multi-head attention, as in the paper
    cfg.model.ffn_hidden = ffn_hidden
    cfg.model.dtype = 'bfloat16'  # GPU compute dtype; params stay float32
    cfg.data.source = 'tfds'  # C4 from a local TFDS data_dir
    cfg.data.seq_len = 256  # tokens per sequence
    cfg.data.global_batch_size = 512  # sequences per step
    cfg.train.steps = 20000  # optimizer steps
    cfg.train.learning_rate = learning_rate  # peak LR, smaller for wider models
    cfg.train.eval_every = 1000  # validation cadence
    cfg.train.checkpoint_every = 1000  # Orbax cadence
    cfg.mecefo.rank = 128  # low-rank r (the benchmark's target setting)
    cfg.mecefo.tau = 100  # SVD refresh period (paper)
    return cfg


# The fields a config's GPU variant may set: how fast a step runs, never what it computes
# (the CPU config stays the run's recipe).
GPU_VARIANT_FIELDS = ('model.attention', 'model.remat_policy', 'model.scan_layers',
                      'model.loss_chunk_tokens', 'train.flat_optimizer')


def with_variant(cfg, variant: str, gpu: dict):
    """`cfg` as it is (variant ''), or with `gpu` ('section.field': value) set (variant 'gpu',
    `--config configs/llama_350m.py:gpu`: the settings a GPU sweep found fastest)."""
    if variant not in ('', 'gpu'):
        raise ValueError(f"config variant {variant!r}: use none (the config as it is) or 'gpu' "
                         "(e.g. --config configs/llama_350m.py:gpu).")
    outside = sorted(set(gpu) - set(GPU_VARIANT_FIELDS))
    if outside:
        raise ValueError(f'GPU variant sets {outside}: it may set only {GPU_VARIANT_FIELDS}.')
    for dotted, value in (gpu.items() if variant == 'gpu' else ()):
        section, name = dotted.split('.')
        cfg[section][name] = value
    return cfg
