"""What the time-to-target experiment runs, and with which settings.

Owns the run list (`default_runs`, the `--default` run and its checks), the
evaluation cadence and the limit past `train.steps` (`Settings`), the stated
cost constants a command line changes (`parse_costs`), the `--smoke` set-up
and the size of the validation split the default validation set covers.
`time_to_target.py` runs what these describe.
"""
import dataclasses
import math

from mecefo_jax.config.resolve import updated
from studies.goodput import TimeCosts
from studies.runs import Run, parse_runs, run_name  # noqa: F401 (the script's)

DEFAULT_CAP = 8  # mecefo_planned's neighbour-row cap on configs/small.py (mixed helpers)
MAX_EVAL_BATCHES = 16  # the default validation set: the whole split once, at most this


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the experiment sets beyond the config (each a flag of the script)."""
    limit_factor: float = 1.5  # a run stops at limit_factor x train.steps, reached or not
    eval_every: int = 50  # steps between evaluations before dense_from
    dense_eval_every: int = 10  # and from dense_from on, where the crossings are
    dense_from: float = 0.8  # a fraction of train.steps
    regime_replicas: int = 32  # fault.regime_replicas: the regimes read per replica
    eval_batches: int = 0  # train.eval_batches; 0: the whole validation split once
    costs: TimeCosts = TimeCosts()
    bench: dict | None = None  # a bench_step.json (--cost bench): measured step ratios

    def __post_init__(self):
        for name, ok, fix in (('limit_factor', self.limit_factor >= 1.0, '1.5'),
                              ('eval_every', self.eval_every >= 1, '50'),
                              ('dense_eval_every', self.dense_eval_every >= 1, '10'),
                              ('dense_from', 0.0 <= self.dense_from <= 1.0, '0.8'),
                              ('regime_replicas', self.regime_replicas >= 0, '32'),
                              ('eval_batches', self.eval_batches >= 0, '0')):
            if not ok:
                raise ValueError(f'--{name}={getattr(self, name)!r} is out of range; '
                                 f'e.g. --{name}={fix}.')

    def limit(self, steps: int) -> int:
        return max(steps, math.ceil(self.limit_factor * steps))

    def evaluate_at(self, steps: int):
        """steps done -> whether to evaluate: every eval_every steps, every
        dense_eval_every from dense_from x steps on, and at `steps`."""
        dense = round(self.dense_from * steps)

        def due(n: int) -> bool:
            if n == steps:
                return True
            return (n - dense) % self.dense_eval_every == 0 if n >= dense else n % self.eval_every == 0
        return due


def default_runs(cfg, cap: int = DEFAULT_CAP) -> tuple[Run, ...]:
    """fault_free; under high mecefo, mecefo_planned uncapped and capped, drop, elastic,
    checkpoint_restart; the config's default strategy (and its cap) under low, mid, high."""
    strategy, own_cap = cfg.fault.strategy, cfg.fault.max_neighbour_rows
    runs = [Run('fault_free', ''), Run('mecefo', 'high'), Run('mecefo_planned', 'high'),
            Run('mecefo_planned', 'high', cap), Run('drop', 'high'), Run('elastic', 'high'),
            Run('checkpoint_restart', 'high')]
    runs += [Run(strategy, regime, own_cap) for regime in ('high', 'low', 'mid')]
    return tuple(dict.fromkeys(runs))


def default_name(cfg) -> str:
    """The run of the config's default strategy (and cap) under high."""
    return run_name(cfg.fault.strategy, 'high', cfg.fault.max_neighbour_rows)


def check_runs(runs, default: str) -> tuple[Run, ...]:
    """`runs` with fault_free first; errors naming the flag for what cannot be run."""
    names = [run_name(*r) for r in runs]
    if len(set(names)) != len(names):
        raise ValueError(f'--runs names a run twice: {", ".join(names)}.')
    if default not in names:
        raise ValueError(f'--default={default!r} is not among the runs ({", ".join(names)}); '
                         'name one of them, or add it to --runs.')
    return (Run('fault_free', ''),) + tuple(r for r in runs if r.strategy != 'fault_free')


def parse_costs(text: str) -> TimeCosts:
    """--costs: 'name=seconds,...' changes to the stated `TimeCosts`."""
    names = [f.name for f in dataclasses.fields(TimeCosts)]
    changes = {}
    for item in (x.strip() for x in text.split(',') if x.strip()):
        name, _, value = item.partition('=')
        if name not in names:
            raise ValueError(f'--costs: {name!r} is no cost constant; use {", ".join(names)}.')
        try:
            changes[name] = float(value)
        except ValueError:
            raise ValueError(f'--costs: {item!r} needs a number, e.g. {name}=10.') from None
    return TimeCosts(**changes)


def smoke(cfg):
    """(cfg, seeds, runs, default, settings) of --smoke: `cfg` (configs/tiny.py) for 8
    steps. 1000 s steps with one replica down at most make `high` take replica 4 down at
    step 5 in seed 0 and fail seed 1 only after 8 steps (few programs to compile);
    checkpoint/restart saves every 2 steps."""
    cfg = updated(cfg, {'train.steps': 8, 'fault.step_time_sec': 1000.0,
                       'fault.max_concurrent': 1, 'fault.checkpoint_every': 2})
    runs = (Run('fault_free', ''), Run('mecefo', 'high'), Run('elastic', 'high'),
            Run('checkpoint_restart', 'high'))
    settings = Settings(eval_every=2, dense_eval_every=1, dense_from=0.5, eval_batches=4)
    return cfg, (0, 1), runs, 'mecefo_high', settings


def val_split_batches(cfg, cap: int = MAX_EVAL_BATCHES) -> float:
    """The validation split's size in global batches of `seq_len + 1` tokens, counted up
    to `cap` batches (a C4-sized split is not tokenized whole)."""
    from mecefo_jax.data import pipeline, sources
    tokenizer = pipeline.make_pipeline(cfg.data, vocab_size=cfg.model.vocab_size, num_shards=1,
                                       split='validation').tokenizer
    batch = cfg.data.global_batch_size * (cfg.data.seq_len + 1)
    tokens = 0
    for document in sources.load_documents(cfg.data, 'validation'):
        tokens += len(tokenizer.encode(document)) + 1  # + EOS, as the pipeline packs
        if tokens >= cap * batch:
            break
    return tokens / batch
