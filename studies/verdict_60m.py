"""The verdict's `paper_like_60m` point: `paper_like` at `configs/llama_60m.py`'s shape.

What its overrides need at the time the point is built: the exported corpus
(`corpus_export.py`) in the assets folder `$VERDICT_ASSETS` (default `.gpu`),
which fixes the horizon. Every run, the longest (`limit_factor` x the steps)
included, reads the train split at most once: steps = train tokens / (tokens
per step x limit_factor), rounded down. Failures keep small's rate per
fraction of the run (60 s steps over 300 steps). `VERDICT_SMOKE=1` shrinks the
model and the steps to `configs/tiny.py`'s for a CPU check of the same path
(`scripts/verdict_gpu.sh --smoke`).
"""
import os

from studies import corpus_export
from studies.time_to_target_settings import Settings

REPLICAS, SEQ_LEN = 32, 256  # 32 replicas of one sequence, as rows on one device
SMOKE_STEPS = 4


def _section(cfg, section: str, fields) -> dict:
    return {f'{section}.{name}': getattr(getattr(cfg, section), name) for name in fields}


def shape() -> dict:
    """`configs/llama_60m.py`'s model section and MeCeFO rank and period, 256 tokens a sequence,
    its 32 replicas as rows on the devices there are."""
    from configs.llama_60m import get_config
    cfg = get_config()
    return {**_section(cfg, 'model', cfg.model.keys()), **_section(cfg, 'mecefo', ('rank', 'tau')),
            'data.seq_len': SEQ_LEN, 'mesh.replicas': REPLICAS}


def smoke_shape() -> dict:
    """`configs/tiny.py`'s model, 32 tokens a sequence: seconds a run on CPU."""
    from configs.tiny import get_config
    cfg = get_config()
    return {**_section(cfg, 'model', cfg.model.keys()), **_section(cfg, 'mecefo', ('rank', 'tau')),
            'data.seq_len': cfg.data.seq_len, 'mesh.replicas': REPLICAS}


def one_pass_steps(train_tokens: int, seq_len: int, limit_factor: float = Settings().limit_factor) -> int:
    """The most steps whose longest run reads `train_tokens` at most once."""
    return int(train_tokens // (REPLICAS * (seq_len + 1) * limit_factor))  # + 1: the shifted target


def overrides() -> dict:
    """The point's overrides read from the assets (a clear error where they are missing)."""
    assets = os.environ.get('VERDICT_ASSETS', '.gpu')
    summary = corpus_export.read_summary(assets)
    smoke = os.environ.get('VERDICT_SMOKE', '') not in ('', '0')
    model = smoke_shape() if smoke else shape()
    if summary['vocab_size'] != model['model.vocab_size']:
        raise ValueError(f"{assets}: its tokenizer has {summary['vocab_size']} pieces, the point's model "
                         f"{model['model.vocab_size']}; export it with --vocab_size "
                         f"{model['model.vocab_size']}.")
    steps = one_pass_steps(summary['train_tokens'], model['data.seq_len'])
    if smoke:
        steps = min(steps, SMOKE_STEPS)
    if steps < SMOKE_STEPS:
        raise ValueError(f'{assets}: {summary["train_tokens"]} train tokens make {steps} steps; '
                         'export a larger corpus.')
    clock = {'fault.step_time_sec': 1000.0} if smoke else {'fault.step_time_sec': 60.0 * 300 / steps}
    return {**model, **corpus_export.text_data(assets), 'data.global_batch_size': REPLICAS,
            'train.steps': steps, **clock}
