"""The one base ConfigDict every `configs/*.py` derives from: every field and its default.

Each field is commented here once; configs override values, never add fields,
so `--config.section.field=value` works the same for all of them. Nothing
else supplies defaults: `mecefo_jax.config_resolve.resolve` turns the ConfigDict
into typed, validated sections, and the code reads only those.
"""
from ml_collections import ConfigDict, config_dict

# mecefo.refresh_split_min_elements: smaller kernels refresh whole on every replica. Named,
# since the refresh's cost model (studies/refresh_costs.py) prices the same default.
DEFAULT_SPLIT_MIN_ELEMENTS = 1 << 18


def _model_section() -> ConfigDict:
    """The LLaMA shape and how it is computed."""
    section = ConfigDict()
    section.vocab_size = 512  # tokenizer and embedding size; a trained tokenizer must match
    section.d_model = 64  # residual width d
    section.num_layers = 2  # transformer blocks
    section.num_heads = 4  # query heads; must divide d_model
    section.num_kv_heads = 4  # key/value heads (grouped-query attention when < num_heads)
    section.ffn_hidden = 172  # SwiGLU hidden width h
    section.rope_theta = 10000.0  # rotary embedding base
    section.norm_eps = 1e-6  # RMSNorm epsilon
    section.dtype = 'float32'  # compute dtype: float32 on CPU, bfloat16 on GPU (params stay float32)
    section.attention = 'auto'  # 'auto' (cuDNN fused on GPU with bfloat16, else XLA) | 'xla' | 'cudnn'
    section.scan_layers = True  # nn.scan over blocks: compile time does not grow with depth
    section.remat_policy = 'none'  # block remat: none | full | save_attention | save_dots
    section.loss_chunk_tokens = 4096  # cross-entropy chunk (tokens); bounds the live logits
    return section


def _data_section() -> ConfigDict:
    """Where documents come from and how they are batched."""
    section = ConfigDict()
    section.source = 'embedded'  # 'embedded' (CPython's docs, offline) | 'python_docs' | 'tfds' | 'text'
    section.tfds_name = 'c4/en'  # TFDS dataset name when source='tfds'
    section.data_dir = ''  # local TFDS data_dir (required for source='tfds')
    section.tfds_text_key = 'text'  # feature holding the document text in TFDS records
    section.text_files = ''  # comma-separated files or globs when source='text'
    section.tokenizer_path = ''  # sentencepiece .model; '' trains one on the train split and caches it
    section.cache_dir = '~/.cache/mecefo_jax'  # where trained tokenizers are cached
    section.seq_len = 64  # tokens per training sequence
    section.global_batch_size = 16  # sequences per step, split evenly over mesh.data replicas
    section.val_fraction = 0.05  # documents held out for validation (embedded/text sources)
    section.seed = 0  # shuffle seed; the sample order depends on nothing else
    return section


def _mesh_section() -> ConfigDict:
    """The (data, model) device mesh."""
    section = ConfigDict()
    section.data = -1  # data-parallel replicas; -1 uses every device left over by mesh.model
    section.model = 1  # tensor-parallel width (shards heads and FFN hidden)
    section.num_cpu_devices = 8  # with no accelerator, simulate this many CPU devices
    # Logical data-parallel replicas simulated as rows on the mesh's data rows; 0: one replica
    # per data row (a failure then takes a device's row out of the mesh). With R > 0 a failure
    # is a role of rows, never a new mesh, and one GPU can hold a 32-replica cluster's batch
    # (mecefo_jax/neighbour/row_packing.py). Single-process jobs only.
    section.replicas = 0
    return section


def _train_section() -> ConfigDict:
    """Optimizer (the paper's AdamW), schedule and cadences."""
    section = ConfigDict()
    section.steps = 200  # optimizer steps
    # Steps the learning-rate schedule spans (warmup + cosine); 0: train.steps. Past
    # them the LR stays at its final value, so a run set to go on past its planned
    # end (studies/time_to_target.py) is the same run, continued.
    section.lr_schedule_steps = 0
    section.learning_rate = 3e-3  # peak learning rate after warmup
    section.warmup_fraction = 0.1  # linear warmup over this fraction of steps
    section.final_lr_fraction = 0.1  # cosine decays to this fraction of the peak
    section.b1 = 0.9  # AdamW beta1 (paper)
    section.b2 = 0.999  # AdamW beta2 (paper)
    section.eps = 1e-8  # AdamW epsilon (paper)
    section.weight_decay = 0.01  # AdamW decoupled weight decay (paper)
    section.grad_clip = 1.0  # global-norm clipping; 0 disables
    # Adam's moments as one vector of every parameter (optax.flatten): one fused update
    # instead of one per parameter leaf, at the price of packing the gradients each step;
    # the vector cannot follow a tensor-parallel split, so mesh.model must be 1.
    section.flat_optimizer = False
    # Sum the replicas' gradients in one fixed order (gather, then sum): bit for bit the same
    # in one process and across processes, for verification runs; gathers every replica's.
    section.ordered_reduction = False
    section.seed = 0  # parameter init seed
    section.log_every = 10  # steps between metrics rows
    section.eval_every = 100  # steps between validation evals; 0 disables periodic eval
    section.eval_batches = 4  # validation batches per eval
    section.checkpoint_every = 100  # steps between Orbax checkpoints; 0 disables
    section.keep_checkpoints = 2  # checkpoints kept on disk
    return section


def _mecefo_section() -> ConfigDict:
    """MeCeFO's low-rank neighbour backward (Hu et al., 2025)."""
    section = ConfigDict()
    section.rank = 0.25  # low-rank r: int >= 1 absolute, or float in (0, 1] of min(in, out)
    section.tau = 100  # refresh the SVD projections every tau steps (paper: 100)
    # The subspace each neighbour-mode FFN kernel gradient is projected onto:
    # 'weights' (the paper's: the kernel's top-r singular directions V, held and
    # refreshed at failure onsets and every tau steps) | 'gradient' (this project's:
    # a rank-r range finder on the batch's own kernel gradient, in the backward
    # pass; no V and no refresh, 2t(n+m)r more FLOPs per kernel and the full FFN
    # inputs kept for backward). docs/algorithm.md, "Gradient-sketched projection".
    section.projection = 'weights'
    # The neighbour's attention branch is identity in backward (the paper's rule). False
    # computes it exactly and counts its attention gradient (an ablation, not a saving).
    section.skip_attention = True
    # Where it skips: the top K blocks still compute their attention backward exactly
    # (a rule: the skip below them then corrupts fewer cotangents); 0: the paper's.
    section.attention_top_blocks = 0
    # The weight of a neighbour-mode row's gradient where it is trusted: 1.0 is the
    # paper's rule, 0.0 treats the row as dropped (mecefo_jax/neighbour/combination.py).
    section.neighbour_weight = 1.0
    # Trust the neighbour in the top K blocks, the final norm and the head only
    # (below, and in the embedding, its rows count as dropped); 0: every block.
    section.trust_top_blocks = 0
    # How V is refreshed: 'subspace' (randomized subspace iteration warm-started
    # from the held V, a few matmuls) | 'svd' (exact full SVD, the reference).
    # docs/algorithm.md, "Cheap projection refresh".
    section.refresh = 'subspace'
    # Subspace iterations per refresh (each: 2 matmuls + thin QRs). Three keep
    # >= 0.99 of the top-r energy after a tau-step random-walk drift at 7B
    # shapes (two: 0.987 on w_down); scripts/bench_refresh.py measures it.
    section.refresh_iters = 3
    # Kernels with at least this many elements per layer split the refresh's
    # products over 'data' (each replica 1/data of them, plus two collectives
    # per kernel and iteration); smaller ones refresh whole on every replica,
    # where 4 r FLOPs per element cost less than a collective's latency (the
    # tiny and small configs; 350M and up split). 0 splits every kernel.
    section.refresh_split_min_elements = DEFAULT_SPLIT_MIN_ELEMENTS
    # Recompute the neighbour's FFN activations in backward (the paper's rule 3).
    # Off: at 350M the neighbour's whole-step peak is 0.93x a normal device's
    # without it, and it costs +19% FLOPs (docs/algorithm.md section 6).
    section.remat_ffn = False
    return section


def _fault_section() -> ConfigDict:
    """Which replicas fail when, and the strategy that absorbs it."""
    section = ConfigDict()
    # mecefo | mecefo_planned | ndb_naive | elastic | drop | checkpoint_restart.
    # 'drop' by measurement: it reached the fault-free loss soonest under `high` at the
    # verdict study's paper_like point (32 replicas, one failure at a time, one pass over
    # the data; 6 seeds, docs/verdict.md; scripts/verdict.py), as on configs/small.py.
    section.strategy = 'drop'
    section.events = ''  # explicit failures 'step:replica:duration,...'; overrides regime
    section.regime = ''  # '' | low | mid | high: the paper's MTBF/MTTR presets
    section.regime_replicas = 0  # regime MTBF is for this many replicas (paper: 32); 0: as is
    section.mtbf_hours = 0.0  # custom cluster-wide mean time between failures (with mttr_hours)
    section.mttr_hours = 0.0  # custom mean time to recovery
    section.step_time_sec = 60.0  # cluster seconds per step, converts hours to steps
    # How failures meet the steps: 'steps' (an outage lasts the same steps under every
    # strategy) | 'wall_clock' (the trace is in cluster seconds; each step advances the clock
    # by step_time_sec x its layout's step ratio, so a strategy whose step is c times slower
    # lives through about 1/c as many steps of the same outage: faults/step_clock.py).
    section.time_model = 'steps'
    # wall_clock: the exposed share of the gradient all-reduce in a fault-free step (0 to <1).
    # It dilutes a slower device's extra compute: c_eff = 1 + (c - 1)(1 - allreduce_exposed).
    section.allreduce_exposed = 0.0
    section.seed = 0  # seed of the random failure process (identical on every host)
    section.max_concurrent = 0  # cap on replicas down at once; 0 = all but one
    # mecefo_planned: at most this many rows per step in neighbour mode, closer to exact
    # gradients at the price of steps over one normal step: fewer neighbour helpers with
    # more rows each, or (no memory bound) mixed helpers that keep their own shard exact
    # and approximate only the adopted rows. 0: no cap.
    section.max_neighbour_rows = 0
    section.checkpoint_every = 10  # checkpoint_restart: save period in steps
    section.relaunch_delay_sec = 120.0  # checkpoint_restart: modelled job relaunch, reported apart
    return section


def _snapshot_section() -> ConfigDict:
    """In-memory snapshots held by keeper processes (docs/launch.md; REFT-style)."""
    section = ConfigDict()
    # Steps between in-memory snapshots under the launcher: 'auto' picks the
    # smallest interval within overhead_budget_pct of the step time (measured,
    # and measured again after a topology change); an integer fixes it; 0 disables.
    section.every = config_dict.FieldReference('auto', field_type=object)
    section.overhead_budget_pct = 2.0  # snapshot.every=auto: most training slowdown, in %
    section.slots = 3  # snapshots each keeper holds (>= 3 so every worker shares a step)
    # Workers holding the same replicated state each write a different 1/n of it (REFT);
    # a restore reads every keeper, and a lost keeper's part comes back from parity.
    section.shard = True
    section.parity = 'xor'  # '' | 'xor': erasure-code snapshots across keepers
    # Keepers per parity group (one lost member each recoverable): 2 keeps a node's loss
    # survivable on as few as 2 nodes (consecutive workers go to different nodes).
    section.parity_group = 2
    return section


def _launch_section() -> ConfigDict:
    """The launcher (python -m mecefo_jax.launch): worker processes, failures, relaunches."""
    section = ConfigDict()
    section.local_devices = 2  # devices per worker: fake CPU devices, or GPUs where the node has them
    # A worker that has not answered the launcher's progress requests this long
    # (stopped or hung; Ray reports dead actors and nodes itself) counts as failed.
    section.heartbeat_timeout_sec = 20.0
    # No step completed this long after a generation's start (joining, restoring, compiling): a hang.
    section.start_timeout_sec = 1800.0
    section.stall_timeout_sec = 600.0  # no step completed anywhere this long (after a generation's first): restart it
    # After SIGTERM or Ctrl-C, how long the workers get to save a step before the
    # launcher kills them (a worker that cannot reach the save would hold it forever);
    # also how long a generation gets to save and end after its last step.
    section.stop_timeout_sec = 300.0
    # Injected failures 'STEP:WORKER[:SIGNAL[:keeper|publish|snapshot]]', 'STEP:WORKER:node[:snapshot]'
    # (tests and drills on simulated nodes) or 'STEP:launcher[:SIGNAL[:snapshot]]', comma-separated
    # (SIGKILL default); docs/launch.md, "Failures".
    section.kill = ''
    section.return_after_steps = 0  # a failed worker rejoins after this many steps; 0: never
    section.recovery = 'memory'  # 'memory' (keepers; survivors go on) | 'disk' (Orbax; restart all)
    section.max_relaunches = 8  # give up after this many relaunches
    # Workers' persistent program cache: 'auto' (workdir/launch/xla_cache), a path, or '' (off).
    section.compilation_cache = 'auto'
    # After the first step, compile (niced, off the training path) the programs
    # the survivors of every single-worker loss will need, into that cache.
    section.compile_ahead = True
    # After each generation's first step, start one warm worker process per worker slot
    # (jax and the training stack imported) that the next relaunch takes: no process
    # start-up or imports on the way back. Each costs about 3 CPU-seconds as it starts;
    # False where spare CPU is scarce (docs/launch.md, "Standby workers").
    section.standby_workers = True
    # Ray's object store per node of a local cluster the launcher starts: small, since
    # the keepers' snapshots live in /dev/shm beside it.
    section.object_store_mb = 256
    # On a cluster of several nodes the launcher refuses a placement where losing one
    # node loses the only copy of part of the state (no whole replica elsewhere, no
    # parity covering it); True runs it anyway (a lost node then means a disk restart).
    section.accept_node_loss = False
    return section

SECTIONS = {'model': _model_section, 'data': _data_section, 'mesh': _mesh_section,
            'train': _train_section, 'mecefo': _mecefo_section, 'fault': _fault_section,
            'snapshot': _snapshot_section, 'launch': _launch_section}


def base_config() -> ConfigDict:
    """Defaults shared by every config (the paper's optimizer settings): one section each."""
    cfg = ConfigDict()
    for name, section in SECTIONS.items():
        cfg[name] = section()
    return cfg


def llama_config(*, d_model: int, num_layers: int, num_heads: int, ffn_hidden: int,
                 learning_rate: float) -> ConfigDict:
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


def with_variant(cfg: ConfigDict, variant: str, gpu: dict) -> ConfigDict:
    """`cfg` as it is (variant ''), or with `gpu` ('section.field': value) set (variant 'gpu',
    `--config configs/llama_350m.py:gpu`: the settings a GPU sweep found fastest)."""
    if variant not in ('', 'gpu'):
        raise ValueError(f"config variant {variant!r}: use none (the config as it is) or 'gpu' "
                         "(e.g. --config configs/llama_350m.py:gpu).")
    outside = sorted(set(gpu) - set(GPU_VARIANT_FIELDS))
    if outside:
        raise ValueError(f'GPU variant sets {outside}: it may set only {GPU_VARIANT_FIELDS}.')
    for dotted, value in (gpu.items() if variant == 'gpu' else ()):
        section, field = dotted.split('.')
        cfg[section][field] = value
    return cfg

