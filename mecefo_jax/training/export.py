"""A run's trained model out as a Hugging Face LLaMA: its parameters from a checkpoint or the keepers' snapshots.

`scripts/hf_export.py` calls `export_run`. The run is rebuilt from its `config.json`
record; the state is restored onto this process's first device (Orbax and the snapshot
restore both reshard on read), and only its parameters are written, by
`model/hf_llama.py`, with the sentencepiece model the run tokenized with.
"""
from __future__ import annotations

import os

from mecefo_jax.checkpointing import checkpoint as ckpt_lib
from mecefo_jax.config import record as config_record
from mecefo_jax.config.defaults import Config
from mecefo_jax.config.resolve import resolve
from mecefo_jax.data.tokenizer import cached_model_path
from mecefo_jax.model import hf_llama, optim
from mecefo_jax.model.llama import build_model
from mecefo_jax.parallel import state as state_lib


def run_config(workdir: str) -> Config:
    """The config that wrote the run in `workdir`, from its record."""
    recorded = config_record.read_config_record(workdir)
    if recorded is None:
        raise FileNotFoundError(f'--workdir={workdir!r} holds no {config_record.CONFIG_FILENAME}: pass the '
                                'workdir of a run that trained at least to its first step.')
    return resolve(recorded)


def _abstract_state(cfg: Config):
    """The run's train state as ShapeDtypeStructs on one device: what either restore fills."""
    import jax
    layout = state_lib.trace_layout(build_model(cfg), optim.make_optimizer(cfg.train), cfg.mecefo.rank)
    return ckpt_lib.abstract_like(layout.abstract, jax.sharding.SingleDeviceSharding(jax.devices()[0]))


def tokenizer_of(cfg: Config) -> str | None:
    """The sentencepiece model the run tokenized with, where it is on this machine."""
    path = os.path.expanduser(cfg.data.tokenizer_path or cached_model_path(cfg.data, cfg.model.vocab_size))
    return path if os.path.isfile(path) else None


def export_run(workdir: str, out: str, *, snapshots=None, step: int | None = None,
               tokenizer: str | None = None) -> dict:
    """Write the run's parameters at `step` (default: the newest) to `out` as HF `LlamaForCausalLM`:
    from the newest Orbax checkpoint, or from `snapshots` (the keepers', `launch.keepers`); what it wrote."""
    cfg = run_config(workdir)
    abstract = _abstract_state(cfg)
    if snapshots is None:
        checkpointer = ckpt_lib.Checkpointer(os.path.join(workdir, 'checkpoints'), save_every=1)
        try:
            state, _ = checkpointer.restore(abstract, step)
        finally:
            checkpointer.close()
        source = 'disk'
    else:
        from mecefo_jax.snapshot import restore
        state, _, _ = restore(abstract, snapshots, step=step)
        source = 'memory'
    tokenizer = tokenizer or tokenizer_of(cfg)
    if tokenizer is None:
        raise FileNotFoundError(
            f'The sentencepiece model of the run in {workdir!r} is not on this machine (data.tokenizer_path, '
            'or the cache under data.cache_dir): pass --tokenizer=PATH.')
    hf_llama.save(out, state.params, cfg.model, max_positions=cfg.data.seq_len, tokenizer_path=tokenizer)
    return {'step': int(state.step), 'source': source, 'out': out, 'tokenizer': tokenizer}
