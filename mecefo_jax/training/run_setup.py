"""`Run`: everything one training run builds once from its config.

The loop, the controllers and the launcher's workers all start from `build_run`.
"""
import dataclasses
import os

from mecefo_jax.checkpointing import checkpoint as ckpt_lib
from mecefo_jax.model import optim
from mecefo_jax.model.llama import Llama, build_model
from mecefo_jax.neighbour.row_packing import Packing, pack
from mecefo_jax.parallel import sharding
from mecefo_jax.parallel import state as state_lib
from mecefo_jax.parallel.topology import TopologyCache
from mecefo_jax.training.metrics import MetricsWriter


@dataclasses.dataclass
class Run:
    """Everything built once from the config."""
    cfg: object
    workdir: str
    model: Llama
    optimizer: object
    full_rows: tuple  # device rows: one per replica, or the mesh's rows with replicas as rows
    state_layout: state_lib.StateLayout  # the state's shapes and mesh axes, traced once
    topologies: TopologyCache
    train_data: object
    val_data: object
    checkpointer: ckpt_lib.Checkpointer | None
    metrics: MetricsWriter
    val_start: dict | None = None  # validation iterator state every eval restarts from

    @property
    def abstract_state(self):
        """Shapes and dtypes of the train state (restore targets), from its layout."""
        return self.state_layout.abstract

    @property
    def replicas_as_rows(self) -> bool:
        """`mesh.replicas` logical replicas packed as rows onto the mesh's devices."""
        return self.cfg.mesh.replicas > 0

    @property
    def num_shards(self) -> int:
        """Logical data-parallel replicas: the global batch always has this many shards."""
        return self.cfg.mesh.replicas if self.replicas_as_rows else len(self.full_rows)

    @property
    def present(self) -> tuple[bool, ...]:
        """Which replicas have devices in this job (all, unless relaunched on survivors)."""
        if self.replicas_as_rows:
            return (True,) * self.num_shards
        return tuple(row is not None for row in self.full_rows)

    def rows_for(self, live) -> tuple:
        """The device rows a step runs on while `live` replicas are up: theirs, or with replicas
        as rows every row (a failure only changes the packing)."""
        if self.replicas_as_rows:
            return self.present_rows
        return tuple(row for row, up in zip(self.full_rows, live) if up)

    def packing(self, layout) -> Packing | None:
        """`layout`'s rows packed onto the devices (replicas as rows), else None."""
        return pack(layout, len(self.present_rows)) if self.replicas_as_rows else None

    @property
    def present_rows(self) -> tuple:
        return tuple(row for row in self.full_rows if row is not None)

    @property
    def shard_batch(self) -> int:
        return self.cfg.data.global_batch_size // self.num_shards

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.data.global_batch_size * self.cfg.data.seq_len


def build_run(cfg, workdir: str, *, checkpoint_every: int | None = None,
              replica_rows=None) -> Run:
    """The `Run` of `cfg`; `replica_rows` lists each replica's devices (default: the config's
    mesh), None for one not in this job (a relaunch on survivors). The number of replicas,
    not of present ones, shards the batch, so a relaunch never changes a shard's samples."""
    from mecefo_jax.data import pipeline as data_lib  # grain/sentencepiece only when training

    os.makedirs(workdir, exist_ok=True)
    model = build_model(cfg)
    optimizer = optim.make_optimizer(cfg.train)
    if replica_rows is None:
        replica_rows = sharding.device_rows(cfg.mesh)
    replica_rows = tuple(None if row is None else tuple(row) for row in replica_rows)
    present_rows = [row for row in replica_rows if row is not None]
    if not present_rows:
        raise ValueError('build_run: no replica has devices in this job.')
    if cfg.mesh.replicas and len(present_rows) < len(replica_rows):
        raise ValueError(f'mesh.replicas={cfg.mesh.replicas} simulates replicas as rows in one job; '
                         'a relaunch on survivors needs one replica per row: set --config.mesh.replicas=0.')
    state_layout = state_lib.layout(model, optimizer, cfg.mecefo.rank)
    num_shards = cfg.mesh.replicas or len(replica_rows)
    vocab = cfg.model.vocab_size
    train_data = data_lib.make_pipeline(cfg.data, vocab_size=vocab, num_shards=num_shards,
                                        split='train')
    val_data = data_lib.make_pipeline(cfg.data, vocab_size=vocab, num_shards=num_shards,
                                      split='validation')
    every = cfg.train.checkpoint_every if checkpoint_every is None else checkpoint_every
    checkpointer = None
    if every > 0:
        checkpointer = ckpt_lib.Checkpointer(os.path.join(workdir, 'checkpoints'),
                                             save_every=every,
                                             keep=cfg.train.keep_checkpoints)
    # config.json waits for init_or_restore: a rejected resume must not overwrite the record.
    return Run(cfg=cfg, workdir=workdir, model=model, optimizer=optimizer,
               full_rows=replica_rows, state_layout=state_layout,
               topologies=TopologyCache(model, optimizer, state_layout, cfg),
               train_data=train_data, val_data=val_data, checkpointer=checkpointer,
               metrics=MetricsWriter(workdir, tensorboard=cfg.train.tensorboard))
