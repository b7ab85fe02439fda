"""Which runs an experiment trains: a strategy under a regime, with its options.

`Run` names one run of the quality, time-to-target and verdict experiments;
`parse_runs` reads their `--runs` flag ('mecefo_planned:high:cap=8,
mecefo:high:top=2'), `run_name` names a run's records and `run_config` turns
a run of a seed into its config.
"""
from __future__ import annotations

from typing import NamedTuple

from mecefo_jax.config.defaults import PROJECTION_RULES
from mecefo_jax.config.resolve import updated
from mecefo_jax.failure_schedule import REGIMES
from mecefo_jax.faults.strategies import strategy_spec


class Run(NamedTuple):
    """One run of the report: a strategy under a regime ('' is no failures), for
    mecefo_planned an optional cap on its rows in neighbour mode (fault.max_neighbour_rows),
    an optional projection rank of its own (mecefo.rank; 0: the config's), an optional
    projection rule of its own (mecefo.projection; '': the config's), the attention
    backward ('exact': mecefo.skip_attention=False) and the neighbour's trust
    (mecefo.neighbour_weight, mecefo.trust_top_blocks; combination.py)."""
    strategy: str
    regime: str
    cap: int = 0
    rank: int = 0
    projection: str = ''
    attention: str = ''
    weight: float = 1.0
    top: int = 0
    attn_top: int = 0


_OPTIONS = ("the fields after the regime are 'cap=N' (N >= 1, fault.max_neighbour_rows; "
            "mecefo_planned only), 'rank=R' (R >= 1, mecefo.rank), 'proj=P' (P one of "
            f"{', '.join(PROJECTION_RULES)}, mecefo.projection), 'attn=exact' "
            "(mecefo.skip_attention=False), 'w=W' (0 <= W < 1, mecefo.neighbour_weight) and "
            "'top=K' (K >= 1, mecefo.trust_top_blocks), 'attn_top=K' (K >= 1, "
            "mecefo.attention_top_blocks), e.g. mecefo_planned:high:cap=8, "
            'mecefo:high:rank=64, mecefo:high:proj=gradient or mecefo:high:top=2')


def run_name(strategy: str, regime: str, cap: int = 0, rank: int = 0, projection: str = '',
             attention: str = '', weight: float = 1.0, top: int = 0, attn_top: int = 0) -> str:
    if strategy == 'fault_free':
        return 'fault_free'
    return (f'{strategy}_{regime}' + (f'_cap{cap}' if cap else '')
            + (f'_rank{rank}' if rank else '') + (f'_proj{projection}' if projection else '')
            + (f'_attn{attention}' if attention else '') + (f'_w{weight:g}' if weight != 1.0 else '')
            + (f'_top{top}' if top else '') + (f'_attntop{attn_top}' if attn_top else ''))


def parse_runs(text: str) -> tuple[Run, ...]:
    """'fault_free,mecefo:high,mecefo_planned:high:cap=8,mecefo:high:rank=64' -> (Run, ...)."""
    runs = []
    for item in (x.strip() for x in text.split(',') if x.strip()):
        strategy, _, rest = item.partition(':')
        regime, _, options = rest.partition(':')
        if strategy == 'fault_free':
            if regime:
                raise ValueError(f'--runs: {item!r}: fault_free takes no regime.')
        else:
            try:
                strategy_spec(strategy)
            except ValueError as e:
                raise ValueError(f'--runs: {item!r}: {e}') from None
            if regime not in REGIMES:
                raise ValueError(f'--runs: {item!r} needs a regime, one of '
                                 f'{", ".join(REGIMES)} (e.g. mecefo:high).')
        runs.append(Run(strategy, regime, **_parse_options(item, strategy, options)))
    if not runs:
        raise ValueError('--runs is empty; e.g. fault_free,mecefo:high.')
    return tuple(runs)


def _parse_options(item: str, strategy: str, text: str) -> dict:
    """The `cap=N`, `rank=R` and `proj=P` fields after the regime, as Run's keyword arguments."""
    options = {}
    for field in (x for x in text.split(':') if x) if text else ():
        key, _, value = field.partition('=')
        if key == 'proj' and 'projection' not in options:
            if value not in PROJECTION_RULES:
                raise ValueError(f"--runs: {item!r}: 'proj={value}': the projection rule "
                                 f"(mecefo.projection) is one of {', '.join(PROJECTION_RULES)}.")
            options['projection'] = value
        elif key in ('cap', 'rank', 'top', 'attn_top') and value.isdigit() and int(value) >= 1 \
                and key not in options:
            options[key] = int(value)
        elif key == 'attn' and value == 'exact' and 'attention' not in options:
            options['attention'] = value
        elif key == 'w' and 'weight' not in options and _is_weight(value):
            options['weight'] = float(value)
        else:
            raise ValueError(f'--runs: {item!r}: {_OPTIONS}.')
    if options.get('cap') and strategy != 'mecefo_planned':
        raise ValueError(f'--runs: {item!r}: a cap limits mecefo_planned plans only; '
                         f'drop it or use mecefo_planned:REGIME:cap=N.')
    return options


def _is_weight(text: str) -> bool:
    try:
        return 0.0 <= float(text) < 1.0
    except ValueError:
        return False


def run_config(cfg, run: Run, seed: int, evals: int):
    """`cfg` for one run of one seed: its strategy, regime, cap, rank, projection rule and
    seeds; no checkpoints. The seed sets the initialisation, the failure trace and the data
    order alike, so seeds differ in all three and every run of a seed shares them."""
    return updated(cfg, {
        'train.seed': seed, 'fault.seed': seed, 'data.seed': seed, 'fault.events': '',
        'fault.regime': run.regime,
        'fault.strategy': 'mecefo' if run.strategy == 'fault_free' else run.strategy,
        'fault.max_neighbour_rows': run.cap,
        'mecefo.rank': run.rank or cfg.mecefo.rank,
        'mecefo.projection': run.projection or cfg.mecefo.projection,
        'mecefo.skip_attention': cfg.mecefo.skip_attention and run.attention != 'exact',
        'mecefo.neighbour_weight': run.weight if run.weight != 1.0 else cfg.mecefo.neighbour_weight,
        'mecefo.trust_top_blocks': run.top or cfg.mecefo.trust_top_blocks,
        'mecefo.attention_top_blocks': run.attn_top or cfg.mecefo.attention_top_blocks,
        'train.checkpoint_every': 0,  # quality only: no checkpoint cost needed
        'train.eval_every': max(1, cfg.train.steps // max(1, evals))})
