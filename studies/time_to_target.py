"""Time to target: which fault-tolerance setting reaches the fault-free model's loss soonest.

Owns the experiment behind `scripts/time_to_target.py`: how each (seed, run) is obtained,
and where its result is kept. Which runs, with which settings, is
`time_to_target_settings.py`'s; the arithmetic `goodput.py`'s, the derived runs
`replay.py`'s, the report `time_to_target_report.py`'s. The method (one seed sets the
initialisation, the data order and the failure trace; the target; runs forked from the
fault-free state at their first failure; `elastic` and `checkpoint_restart` replayed):
docs/time_to_target.md, "How it is measured". A stored record made under another data
seed or failure clock is another run, and is trained again.

Resumable: each (seed, run) is written atomically to `seed<s>/<run>.json` when it
finishes and is not run again; an interrupted command loses only the run in progress
(its work directory is started afresh).
"""
import json
import math
import os
import shutil
import time

from mecefo_jax.config.resolve import updated
from studies.goodput import LayoutBook, TimeModel
from studies.replay import DERIVED, replay
from studies.report import write_json
from studies.runs import Run, run_config, run_name
from studies.time_to_target_settings import (
    MAX_EVAL_BATCHES,
    Settings,
    check_runs,
    val_split_batches,
)


def experiment_config(cfg, run: Run, seed: int, settings: Settings):
    """One run's config: its strategy, regime, cap, rank, rule and seed; `train.steps` at the limit
    with the learning-rate horizon kept at `train.steps`; evaluations by the observer."""
    steps = cfg.train.steps
    return updated(run_config(cfg, run, seed, evals=1), {
        'train.steps': settings.limit(steps), 'train.lr_schedule_steps': steps,
        'train.eval_every': 0, 'fault.regime_replicas': settings.regime_replicas})


def failure_trace(run_cfg, replicas: int) -> list:
    """The run's failure events over its whole length (the fault controller's own call)."""
    from mecefo_jax.failure_schedule import events_from_config
    return events_from_config(run_cfg.fault, num_replicas=replicas, total_steps=run_cfg.train.steps)


def wall_clock_events(strategy: str, events, run_cfg, replicas: int, model=None) -> list:
    """`events` (in fault-free steps of `fault.step_time_sec`) as a derived strategy's own
    executed steps meet them on the wall clock: each step advances the clock by its layout's
    ratio, and a replica is down over the steps whose clock falls in its outage. `replay`
    then runs on these as on any trace.

    Without `model`, the fault controller's clock (`step_clock.layout_step_ratio`): steps
    alone advance it, as in a trained run. With `model` (a `goodput.TimeModel`), its step
    ratios, and each live-set change also stands the run still for the change's seconds
    (detect, rebuild or relaunch, compile: `TimeModel.change_sec`) while the trace goes on."""
    from mecefo_jax.failure_schedule import FailureEvent, FailureSchedule
    from mecefo_jax.faults import step_clock
    from mecefo_jax.faults.strategies import layout_for
    schedule = FailureSchedule(events, replicas)
    ratio = step_clock.layout_step_ratio(run_cfg, replicas) if model is None else model.programs_ratio
    clock = step_clock.WallClock(run_cfg.fault.step_time_sec, ratio)
    shard, horizon = run_cfg.data.global_batch_size // replicas, run_cfg.train.steps
    book, previous, layouts = LayoutBook(), (True,) * replicas, {}
    seen = set() if model is None else {book.add(model.precompiled(replicas))}
    down, out = {}, []
    for step in range(horizon):  # no step is faster than a fault-free one: the trace ends here
        live = schedule.live_mask(clock.schedule_step(step))
        for replica, up in enumerate(live):
            if not up and replica not in down:
                down[replica] = step
            elif up and replica in down:
                start = down.pop(replica)
                out.append(FailureEvent(start, replica, step - start))
        if live not in layouts:
            layouts[live] = layout_for(strategy, live, shard)
        layout = layouts[live]
        if model is not None:  # as `replay` meets a change before this step, and `timeline` charges it
            index = book.index(live, layout)
            if live != previous:
                clock.seconds += model.change_sec(strategy == 'checkpoint_restart', index not in seen)
            seen.add(index)
        previous = live
        clock.advance(layout.programs)
    out += [FailureEvent(start, replica, horizon - start) for replica, start in down.items()]
    return sorted(out, key=lambda e: (e.step, e.replica))


def derived_record(strategy: str, events, run_cfg, replicas: int, steps: int, model=None) -> dict:
    """The record of `strategy` (one of replay.DERIVED) on `events` until it has done `steps`
    steps; on the wall clock, as its own steps (and, with `model`, its pauses) meet them
    (`wall_clock_events`), which `pauses_on_clock` says."""
    wall = run_cfg.fault.time_model == 'wall_clock'
    if wall:
        events = wall_clock_events(strategy, events, run_cfg, replicas, model)
    return dict(replay(strategy, events, num_replicas=replicas,
                       shard_batch=run_cfg.data.global_batch_size // replicas, steps=steps,
                       checkpoint_every=run_cfg.fault.checkpoint_every),
                pauses_on_clock=wall and model is not None)


def _restore_from(directory: str):
    """A `run.run` restore that starts from the state saved in `directory`."""
    def restore(run, topology):
        from mecefo_jax.checkpointing.checkpoint import Checkpointer
        from mecefo_jax.training import resume
        saver = Checkpointer(directory, save_every=1, keep=1)
        try:
            state, data_state = resume.restore_onto(run, saver, topology)
        finally:
            saver.close()
        return state, data_state, 'disk'
    return restore


def train_record(run_cfg, workdir: str, *, steps: int, target, settings: Settings,
                 fork_dirs=None, start_dir: str | None = None) -> dict:
    """Train one run (afresh, or from the state in `start_dir`) under `TargetWatch`."""
    from mecefo_jax.run import run as train_run
    from mecefo_jax.training.run_setup import build_run
    from studies.probes import TargetWatch
    shutil.rmtree(workdir, ignore_errors=True)  # what an interrupted attempt left
    run = build_run(run_cfg, workdir)
    watch = TargetWatch(run, steps=steps, target=target, evaluate_at=settings.evaluate_at(steps),
                        fork_dirs=fork_dirs)
    summary = train_run(run_cfg, workdir, run=run, observers=[watch],
                        restore=_restore_from(start_dir) if start_dir else None)
    keys = ('kind', 'clock', 'step', 'lost_steps')
    return {'executed': summary['executed'], 'layouts': summary['layouts'],
            'events': [{k: e[k] for k in keys} for e in summary['events']],
            'refresh_steps': summary['refresh_steps'], 'saves': [],
            'relaunch': run_cfg.fault.strategy == 'checkpoint_restart',
            'val_curve': summary['val_curve'], 'row_losses': summary['row_losses']}


def with_prefix(record: dict, free: dict, start: int) -> dict:
    """A run started from the fault-free state after `start` steps, with the fault-free
    run's steps, layouts and evaluations before it."""
    book = LayoutBook(free['layouts'])
    remap = [book.add(entry) for entry in record['layouts']]
    executed = [e for e in free['executed'] if e[1] < start]
    executed += [[clock, step, remap[i]] for clock, step, i in record['executed']]
    val = [v for v in free['val_curve'] if v[0] <= start] + record['val_curve']
    return dict(record, executed=executed, layouts=book.layouts, val_curve=val)


def _fork_dir(seed_dir: str, step: int) -> str:
    return os.path.join(seed_dir, 'fork', f'step{step}')


def _latest_fork(seed_dir: str, first_failure: int) -> int:
    """The latest fault-free state saved at or before `first_failure` (0: none)."""
    saved = [int(name[4:]) for name in os.listdir(os.path.join(seed_dir, 'fork'))
             if name.startswith('step')] if os.path.isdir(os.path.join(seed_dir, 'fork')) else []
    return max((s for s in saved if s <= first_failure), default=0)


def _stale(record: dict, run_cfg) -> str:
    """Why a stored record is not this run ('' where it is): another data seed, or, for a
    run with failures, another clock (for a derived run on the wall clock, one its pauses
    did not advance: replaying it again trains nothing). Records from before a field
    existed hold its first value (data seed 0, 'steps', no all-reduce, no pauses)."""
    if record.get('data_seed', 0) != run_cfg.data.seed:
        return f"ran on data.seed={record.get('data_seed', 0)}, not {run_cfg.data.seed}"
    clock = (record.get('time_model', 'steps'), record.get('allreduce_exposed', 0.0))
    wanted = (run_cfg.fault.time_model, run_cfg.fault.allreduce_exposed)
    if record['strategy'] != 'fault_free' and clock != wanted:
        return f'met its failures on the clock {clock}, not {wanted}'
    if record['strategy'] in DERIVED and wanted[0] == 'wall_clock' and not record.get('pauses_on_clock'):
        return 'was replayed with its live-set changes off the clock'
    return ''


RECORD_KEYS = ('executed', 'layouts', 'events', 'refresh_steps', 'saves', 'relaunch',
               'val_curve', 'row_losses')


class _Seed:
    """One seed's runs: where they are kept, and how each is obtained (module docstring)."""

    def __init__(self, cfg, seed: int, out_dir: str, settings: Settings, replicas: int, log):
        self.cfg, self.seed, self.settings, self.replicas, self.log = cfg, seed, settings, replicas, log
        self.dir = os.path.join(out_dir, f'seed{seed}')
        self.steps = cfg.train.steps
        os.makedirs(self.dir, exist_ok=True)

    def path(self, name: str) -> str:
        return os.path.join(self.dir, f'{name}.json')

    def trace(self, run: Run):
        run_cfg = experiment_config(self.cfg, run, self.seed, self.settings)
        return run_cfg, failure_trace(run_cfg, self.replicas)

    def record(self, run: Run, free: dict | None, runs) -> dict:
        """The stored record of `run`, or obtained now (and stored)."""
        name = run_name(*run)
        run_cfg, events = self.trace(run)
        if os.path.exists(self.path(name)):
            with open(self.path(name)) as f:
                stored = json.load(f)
            stale = _stale(stored, run_cfg)
            if not stale:
                return stored
            self.log(f'[ttt] seed {self.seed}: {name}: the stored record {stale}; training it again')
        from mecefo_jax.failure_schedule import format_events
        first = events[0].step if events else None
        self.log(f'[ttt] seed {self.seed}: {name}: start (' + (
            f'{len(events)} failure(s) in {run_cfg.train.steps} steps, the first at step {first})'
            if events else 'no failure)'))
        start, cpu = time.perf_counter(), time.process_time()
        if free is None:
            how, record = 'trained', self._fault_free(run_cfg, runs)
        else:
            how, record = self._obtain(run, run_cfg, events, free)
        record = {'run': name, 'strategy': run.strategy, 'regime': run.regime, 'cap': run.cap,
                  'rank': run.rank or self.cfg.mecefo.rank,
                  'projection': run.projection or self.cfg.mecefo.projection,
                  'skip_attention': run_cfg.mecefo.skip_attention,
                  'attention_top_blocks': run_cfg.mecefo.attention_top_blocks,
                  'seed': self.seed, 'data_seed': run_cfg.data.seed,
                  'time_model': run_cfg.fault.time_model,
                  'allreduce_exposed': run_cfg.fault.allreduce_exposed,
                  'how': how, 'schedule': format_events(events),
                  'first_failure': first, **record, 'wall_sec': time.perf_counter() - start,
                  'cpu_sec': time.process_time() - cpu}
        write_json(self.path(name), record)
        record = json.loads(json.dumps(record))  # as a rerun will read it
        done, (step, loss) = len(record['executed']), record['val_curve'][-1]
        self.log(f'[ttt] seed {self.seed}: {name}: {how}; {done} steps executed, last eval '
                 f'step {step} val loss {loss:.4f} ({record["wall_sec"]:.0f} s, '
                 f'{record["cpu_sec"]:.0f} CPU-s)')
        return record

    def _fault_free(self, run_cfg, runs) -> dict:
        """Train it, saving its state at every trained run's first failure."""
        forks = {}
        for run in runs:
            if run.strategy in DERIVED or run.strategy == 'fault_free':
                continue
            events = self.trace(run)[1]
            if events and 0 < events[0].step < self.steps:
                forks[events[0].step] = _fork_dir(self.dir, events[0].step)
        shutil.rmtree(os.path.join(self.dir, 'fork'), ignore_errors=True)
        return train_record(run_cfg, os.path.join(self.dir, 'work', 'fault_free'),
                            steps=self.steps, target=None, settings=self.settings, fork_dirs=forks)

    def _obtain(self, run: Run, run_cfg, events, free: dict) -> tuple[str, dict]:
        if run.strategy in DERIVED:
            # The controller's step ratios, and the pauses its clock leaves out.
            model = TimeModel(run_cfg, self.replicas, self.settings.costs)
            record = derived_record(run.strategy, events, run_cfg, self.replicas, self.steps, model)
            return ('derived from fault_free (the same gradients), replayed on its trace',
                    dict(record, val_curve=free['val_curve'], row_losses=None))
        first = events[0].step if events else self.steps
        if first >= self.steps:
            return (f'fault_free: no failure in its first {self.steps} steps',
                    dict({k: free[k] for k in RECORD_KEYS}, events=[]))
        target = free['val_curve'][-1][1]
        # The fault-free state holds projections of the config's rank: a run of its own
        # rank trains its (identical) fault-free prefix itself. A run of another rule
        # starts from that state: its projections have the same shape, no step before the
        # first failure reads them, and the 'gradient' rule never does.
        fork = 0 if run.rank else _latest_fork(self.dir, first)
        record = train_record(run_cfg, os.path.join(self.dir, 'work', run_name(*run)),
                              steps=self.steps, target=target, settings=self.settings,
                              start_dir=_fork_dir(self.dir, fork) if fork else None)
        if not fork:
            return 'trained', record
        return f'trained from the fault-free state at step {fork}', with_prefix(record, free, fork)


def run_all(cfg, out_dir: str, *, seeds, runs, settings: Settings, log=print) -> dict:
    """{seed: {run name: record}}: every (seed, run), the fault-free run of a seed first."""
    from studies.replicas import num_replicas
    replicas = num_replicas(cfg)
    records = {}
    for seed in seeds:
        one = _Seed(cfg, seed, out_dir, settings, replicas, log)
        free = one.record(runs[0], None, runs)
        records[seed] = {'fault_free': free}
        for run in runs[1:]:
            records[seed][run_name(*run)] = one.record(run, free, runs)
    return records


def time_to_target(cfg, out_dir: str, *, seeds, runs, default: str,
                   settings: Settings | None = None, config_name: str = '', log=print) -> dict:
    """Every (seed, run), then `time_to_target.{json,md,png}` in `out_dir`; returns the JSON."""
    settings = settings or Settings()
    from studies import time_to_target_report as report_lib
    from studies.report import distinct_seeds
    seeds = distinct_seeds(seeds)
    runs = check_runs(runs, default)
    split = val_split_batches(cfg)
    batches = settings.eval_batches or min(MAX_EVAL_BATCHES, math.ceil(split))
    cfg = updated(cfg, {'train.eval_batches': batches})
    os.makedirs(out_dir, exist_ok=True)
    records = run_all(cfg, out_dir, seeds=seeds, runs=runs, settings=settings, log=log)
    report = report_lib.summarise(records, cfg=cfg, settings=settings, default=default,
                                  val_split_batches=split, config_name=config_name)
    report_lib.write(report, out_dir, report_lib.output_name(settings))
    return report
