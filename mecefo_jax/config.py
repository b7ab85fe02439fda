"""The one base ConfigDict every `configs/*.py` derives from, and its validation.

Each field is commented here once; configs override values, never add fields,
so `--config.section.field=value` works the same for all of them.
`ConfigDict` is ml_collections' when it is installed, else the minimal
stand-in of `configdict.py` (the benchmark scripts run without it).
"""
from mecefo_jax.configdict import ConfigDict


def base_config() -> ConfigDict:
    """Defaults shared by every config (the paper's optimizer settings)."""
    cfg = ConfigDict()

    cfg.model = ConfigDict()
    cfg.model.vocab_size = 512  # tokenizer and embedding size; a trained tokenizer must match
    cfg.model.d_model = 64  # residual width d
    cfg.model.num_layers = 2  # transformer blocks
    cfg.model.num_heads = 4  # query heads; must divide d_model
    cfg.model.num_kv_heads = 4  # key/value heads (grouped-query attention when < num_heads)
    cfg.model.ffn_hidden = 172  # SwiGLU hidden width h
    cfg.model.rope_theta = 10000.0  # rotary embedding base
    cfg.model.norm_eps = 1e-6  # RMSNorm epsilon
    cfg.model.dtype = 'float32'  # compute dtype: float32 on CPU, bfloat16 on GPU (params stay float32)
    cfg.model.attention = 'auto'  # 'auto' (cuDNN fused on GPU with bfloat16, else XLA) | 'xla' | 'cudnn'
    cfg.model.scan_layers = True  # nn.scan over blocks: compile time does not grow with depth
    cfg.model.remat_policy = 'none'  # block remat: none | full | save_attention | save_dots
    cfg.model.loss_chunk_tokens = 4096  # cross-entropy chunk (tokens); bounds the live logits

    cfg.data = ConfigDict()
    cfg.data.source = 'embedded'  # 'embedded' (CPython's docs, offline) | 'tfds' | 'text'
    cfg.data.tfds_name = 'c4/en'  # TFDS dataset name when source='tfds'
    cfg.data.data_dir = ''  # local TFDS data_dir (required for source='tfds')
    cfg.data.tfds_text_key = 'text'  # feature holding the document text in TFDS records
    cfg.data.text_files = ''  # comma-separated files or globs when source='text'
    cfg.data.tokenizer_path = ''  # sentencepiece .model; '' trains one on the train split and caches it
    cfg.data.cache_dir = ''  # tokenizer cache; '' means ~/.cache/mecefo_jax
    cfg.data.seq_len = 64  # tokens per training sequence
    cfg.data.global_batch_size = 16  # sequences per step, split evenly over mesh.data replicas
    cfg.data.val_fraction = 0.05  # documents held out for validation (embedded/text sources)
    cfg.data.seed = 0  # shuffle seed; the sample order depends on nothing else

    cfg.mesh = ConfigDict()
    cfg.mesh.data = -1  # data-parallel replicas; -1 uses every device left over by mesh.model
    cfg.mesh.model = 1  # tensor-parallel width (shards heads and FFN hidden)
    cfg.mesh.num_cpu_devices = 8  # with no accelerator, simulate this many CPU devices

    cfg.train = ConfigDict()
    cfg.train.steps = 200  # optimizer steps
    cfg.train.learning_rate = 3e-3  # peak learning rate after warmup
    cfg.train.warmup_fraction = 0.1  # linear warmup over this fraction of steps
    cfg.train.final_lr_fraction = 0.1  # cosine decays to this fraction of the peak
    cfg.train.b1 = 0.9  # AdamW beta1 (paper)
    cfg.train.b2 = 0.999  # AdamW beta2 (paper)
    cfg.train.eps = 1e-8  # AdamW epsilon (paper)
    cfg.train.weight_decay = 0.01  # AdamW decoupled weight decay (paper)
    cfg.train.grad_clip = 1.0  # global-norm clipping; 0 disables
    cfg.train.seed = 0  # parameter init seed
    cfg.train.log_every = 10  # steps between metrics rows
    cfg.train.eval_every = 100  # steps between validation evals; 0 disables periodic eval
    cfg.train.eval_batches = 4  # validation batches per eval
    cfg.train.checkpoint_every = 100  # steps between Orbax checkpoints; 0 disables
    cfg.train.keep_checkpoints = 2  # checkpoints kept on disk

    cfg.mecefo = ConfigDict()
    cfg.mecefo.rank = 0.25  # low-rank r: int >= 1 absolute, or float in (0, 1] of min(in, out)
    cfg.mecefo.tau = 100  # refresh the SVD projections every tau steps (paper: 100)
    # Recompute the neighbour's FFN activations in backward (the paper's rule 3).
    # Off: at 350M the neighbour's whole-step peak is 0.93x a normal device's
    # without it, and it costs +19% FLOPs (docs/algorithm.md section 6).
    cfg.mecefo.remat_ffn = False

    cfg.fault = ConfigDict()
    cfg.fault.strategy = 'mecefo'  # mecefo | mecefo_planned | ndb_naive | elastic | drop | checkpoint_restart | mecefo_spread
    cfg.fault.events = ''  # explicit failures 'step:replica:duration,...'; overrides regime
    cfg.fault.regime = ''  # '' | low | mid | high: the paper's MTBF/MTTR presets
    cfg.fault.regime_replicas = 0  # regime MTBF is for this many replicas (paper: 32); 0: as is
    cfg.fault.mtbf_hours = 0.0  # custom cluster-wide mean time between failures (with mttr_hours)
    cfg.fault.mttr_hours = 0.0  # custom mean time to recovery
    cfg.fault.step_time_sec = 60.0  # cluster seconds per step, converts hours to steps
    cfg.fault.seed = 0  # seed of the random failure process (identical on every host)
    cfg.fault.max_concurrent = 0  # cap on replicas down at once; 0 = all but one
    cfg.fault.spread_k = 2  # neighbours sharing a failed shard under mecefo_spread
    cfg.fault.checkpoint_every = 10  # checkpoint_restart: save period in steps
    cfg.fault.relaunch_delay_sec = 120.0  # checkpoint_restart: modelled job relaunch, reported apart

    # In-memory snapshots held by keeper processes (docs/launch.md; REFT-style).
    cfg.snapshot = ConfigDict()
    cfg.snapshot.every = 1  # steps between in-memory snapshots under the launcher; 0 disables
    cfg.snapshot.slots = 3  # snapshots each keeper holds (>= 3 so every worker shares a step)
    cfg.snapshot.parity = ''  # '' | 'xor': erasure-code snapshots across keepers
    cfg.snapshot.parity_group = 4  # keepers per parity group (one lost member recoverable)

    # The launcher (python -m mecefo_jax.launch): worker processes, failures, relaunches.
    cfg.launch = ConfigDict()
    cfg.launch.local_devices = 2  # CPU devices per worker on one machine (GPUs: what the host has)
    cfg.launch.heartbeat_timeout_sec = 20.0  # a worker silent this long counts as failed
    cfg.launch.stall_timeout_sec = 600.0  # no step completed anywhere this long (after a generation's first): restart it
    cfg.launch.kill = ''  # injected failures 'STEP:WORKER[:SIGNAL[:keeper]],...' (SIGKILL default)
    cfg.launch.return_after_steps = 0  # a failed worker rejoins after this many steps; 0: never
    cfg.launch.recovery = 'memory'  # 'memory' (keepers; survivors go on) | 'disk' (Orbax; restart all)
    cfg.launch.max_relaunches = 8  # give up after this many relaunches
    cfg.launch.compilation_cache = 'auto'  # workers' persistent XLA cache: 'auto' (workdir/launch/xla_cache), a path, or '' (off)
    return cfg


def llama_config(*, d_model: int, num_layers: int, num_heads: int, ffn_hidden: int,
                 learning_rate: float) -> ConfigDict:
    """A LLaMA shape (docs/algorithm.md) on C4 with the MeCeFO paper's AdamW settings.

    Sequence length, batch, steps, learning rate and rank are not given by
    the paper: these are our choices (README), shared by every size.
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
