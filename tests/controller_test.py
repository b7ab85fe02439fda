"""The fault controllers end to end: the tiny config on 8 fake CPU devices under failures.

Compilation dominates on CPU, so every run here shares one `TopologyCache`
(a mesh and layout signature compiled by one run is reused by the next) and
the deterministic initial state is created once and copied. All runs use the
same model, optimizer and `train.steps`, so the shared compiled steps are the
ones each run would have built itself. Runs are module-scoped fixtures whose
probe (an observer) records what every step saw; the tests only inspect
those records.

Exact gradients of the combined MeCeFO step against per-shard `jax.grad` are
tests/step_test.py's job; here we check that the controller's strategy hands
the step the right layout, and what the step reports back for it.
"""
import dataclasses
import hashlib

import jax
import numpy as np
import pytest

from configs.tiny import get_config
from mecefo_jax import failure_schedule as schedule_lib
from mecefo_jax import run as run_lib
from mecefo_jax.config.defaults import STRATEGIES
from mecefo_jax.config.resolve import resolve, updated
from mecefo_jax.faults.planner import config_planner
from mecefo_jax.faults.strategies import (
    SPECS,
    AllReplicasDownError,
    layout_for,
)
from mecefo_jax.model.llama import build_model
from mecefo_jax.neighbour.layout import ROLE_NEIGHBOUR, ROLE_NORMAL, full_layout
from mecefo_jax.parallel import state as state_lib
from mecefo_jax.training import resume, run_setup
from mecefo_jax.training.metrics import read_metrics
from mecefo_jax.training.observers import Observer, TokenCount
from studies.probes import GradientError

N = 8  # replicas (fake devices, mesh.model = 1)
STEPS = 10
B = 2  # examples per shard: global batch 16 over 8 shards
SEQ = 32
TOKENS_PER_SHARD = B * SEQ


# ----------------------------------------------------------------- fixtures


@pytest.fixture(scope='session')
def cache_dir(tokenizer_cache):
    return tokenizer_cache  # the session's (tests/conftest.py)


def config(cache_dir, **fault):
    cfg = get_config()
    cfg.data.cache_dir = cache_dir
    cfg.train.steps = STEPS
    cfg.train.eval_every = 0  # the final step still evaluates
    cfg.train.checkpoint_every = 0
    cfg.train.log_every = 1
    for key, value in fault.items():
        cfg.fault[key] = value
    return resolve(cfg)


def unchecked(cfg, **fault):
    """`cfg` with fault fields set past resolve's checks, to reach the controller's own."""
    return dataclasses.replace(cfg, fault=dataclasses.replace(cfg.fault, **fault))


@pytest.fixture(scope='module')
def topologies(cache_dir, tmp_path_factory):
    """One TopologyCache for the module, and the initial state created once.

    `create_train_state` is deterministic in (mesh, seed, rank); compiling its
    initialiser costs about as much as a train step, so later runs get a fresh
    copy (the step donates its input) of the first result.
    """
    real = state_lib.create_train_state
    made = {}

    def create_once(model, optimizer, mesh, *, seed, rank, shardings=None):
        key = (tuple(d.id for d in mesh.devices.flat), mesh.devices.shape, seed, rank)
        if key not in made:
            made[key] = real(model, optimizer, mesh, seed=seed, rank=rank, shardings=shardings)
        state, shardings = made[key]
        copy = jax.tree.map(lambda x: jax.device_put(x, x.sharding, may_alias=False), state)
        return copy, shardings

    patch = pytest.MonkeyPatch()
    patch.setattr(state_lib, 'create_train_state', create_once)
    seed_run = run_setup.build_run(config(cache_dir), str(tmp_path_factory.mktemp('seed_run')))
    yield seed_run.topologies
    patch.undo()


class RecordingData:
    """The train pipeline, remembering a hash of every batch it hands out."""

    def __init__(self, inner):
        self.inner, self.hashes = inner, []

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self.inner)
        self.hashes.append(hashlib.sha256(np.ascontiguousarray(batch).tobytes()).hexdigest())
        return batch

    def __getattr__(self, name):
        return getattr(self.inner, name)


def replica_mismatches(tree) -> list[str]:
    """Leaves whose copies of one index differ between devices (bitwise)."""
    bad = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        copies = {}
        for shard in leaf.addressable_shards:
            key = tuple((s.start, s.stop, s.step) for s in shard.index)
            copies.setdefault(key, []).append(np.asarray(shard.data).tobytes())
        if any(len(set(c)) != 1 for c in copies.values()):
            bad.append(jax.tree_util.keystr(path))
    return bad


def devices_of(state) -> frozenset:
    return frozenset(d.id for leaf in jax.tree.leaves(state.params)
                     for d in leaf.sharding.device_set)


class Probe(Observer):
    """Records, per executed step, what ran where and the state it produced."""

    def __init__(self):
        self.trace = []  # one dict per executed step
        self.restored = []  # (clock, step, host state) after each rollback
        self.events = []  # as reported to observers

    def on_plan(self, planned):
        if planned.plan.data_state is not None:
            self.restored.append((planned.clock, int(planned.state.step),
                                  jax.device_get(planned.state)))

    def on_event(self, event):
        self.events.append(dataclasses.asdict(event))

    def on_step(self, done):
        metrics, state = done.metrics, done.state
        self.trace.append({
            'clock': done.clock, 'step': done.step, 'live': done.live, 'layout': done.layout,
            'devices': devices_of(state), 'mismatches': replica_mismatches(state),
            'tokens': float(metrics['tokens']), 'attn_tokens': float(metrics['attn_tokens']),
            'loss': float(metrics['loss']), 'state_after': jax.device_get(state)})


@dataclasses.dataclass
class Result:
    summary: dict
    probe: Probe
    run: run_setup.Run
    workdir: str
    cfg: object
    precompiled: dict  # (rows, signature) -> already compiled before this run

    @property
    def rows(self):
        return read_metrics(self.workdir)


def fault_run(cfg, workdir, topologies, *, checkpoint_every=None, watch=(), observers=()):
    """run.run with a Probe (and `observers`) on a run sharing `topologies`."""
    run = run_setup.build_run(cfg, workdir, checkpoint_every=checkpoint_every)
    run = dataclasses.replace(run, topologies=topologies, train_data=RecordingData(run.train_data))
    precompiled = {}
    for live, signature in watch:
        rows = [row for row, up in zip(run.full_rows, live) if up]
        precompiled[(tuple(live), signature)] = signature in topologies.get(rows).compiled
    probe = Probe()
    summary = run_lib.run(cfg, workdir, run=run,
                       observers=[probe, TokenCount(SEQ), *observers])
    return Result(summary, probe, run, workdir, cfg, precompiled)


def mask(*down):
    return tuple(r not in down for r in range(N))


def tree_equal(a, b) -> bool:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(
        np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(x, y)
        for x, y in zip(la, lb))


# Replica 3 fails at step 2; its adopter (4) fails at step 4 while adopting
# and recovers at 6; 3 recovers at 8. Covers a single failure, an adjacent
# double failure where the adopter itself fails, a partial and a full recovery.
MECEFO_EVENTS = '2:3:6,4:4:2'
MECEFO_TAU = 3
GRAD_ERROR_EVERY = 3
MECEFO_MASKS = {2: mask(3), 3: mask(3), 4: mask(3, 4), 5: mask(3, 4), 6: mask(3), 7: mask(3)}


@pytest.fixture(scope='module')
def mecefo_run(cache_dir, topologies, tmp_path_factory):
    cfg = updated(config(cache_dir, strategy='mecefo', events=MECEFO_EVENTS),
        {'mecefo.tau': MECEFO_TAU})
    watch = [(mask(3), (7, 2, B)), (mask(3, 4), (6, 2, B))]
    # A heavy observer too: it reads the state and computes gradients before
    # steps, which must not change what is trained (test_observers_...).
    model = build_model(cfg)
    return fault_run(cfg, str(tmp_path_factory.mktemp('mecefo')), topologies, watch=watch,
                     observers=[GradientError(model, GRAD_ERROR_EVERY)])


# checkpoint_restart: saves at steps 0, 4, 8; replica 3 fails at clock 6,
# so steps 4 and 5 are lost and redone; it recovers at clock 9.
RESTART_EVENTS = '6:3:3'
RESTART_EVERY = 4


@pytest.fixture(scope='module')
def restart_run(cache_dir, topologies, tmp_path_factory):
    cfg = config(cache_dir, strategy='checkpoint_restart', events=RESTART_EVENTS,
                 checkpoint_every=RESTART_EVERY, relaunch_delay_sec=42.0)
    return fault_run(cfg, str(tmp_path_factory.mktemp('restart')), topologies)


SIMPLE_EVENTS = '2:3:3'  # replica 3 down for steps 2, 3, 4


@pytest.fixture(scope='module')
def strategy_runs(cache_dir, topologies, tmp_path_factory, request):
    """One short failure + recovery per strategy (mecefo/checkpoint_restart reuse theirs)."""
    cache = {}

    def get(strategy):
        if strategy == 'mecefo':
            return request.getfixturevalue('mecefo_run')
        if strategy == 'checkpoint_restart':
            return request.getfixturevalue('restart_run')
        if strategy not in cache:
            cfg = config(cache_dir, strategy=strategy, events=SIMPLE_EVENTS)
            cache[strategy] = fault_run(cfg, str(tmp_path_factory.mktemp(strategy)), topologies)
        return cache[strategy]
    return get


# ------------------------------------------------------- mecefo under faults


def test_mecefo_training_continues_with_finite_loss(mecefo_run):
    s = mecefo_run.summary
    assert s['final_step'] == STEPS and s['executed_steps'] == STEPS
    assert s['lost_steps'] == 0
    assert [t['step'] for t in mecefo_run.probe.trace] == list(range(STEPS))
    losses = [t['loss'] for t in mecefo_run.probe.trace]
    assert np.isfinite(losses).all(), losses
    assert np.isfinite(s['final_loss']) and np.isfinite(s['final_val_loss'])
    logged = [r['loss'] for r in mecefo_run.rows if 'loss' in r]
    assert len(logged) == STEPS and np.isfinite(logged).all()
    # No sample is lost under MeCeFO: every step processed the whole global batch.
    assert s['useful_tokens'] == STEPS * N * TOKENS_PER_SHARD


def test_mecefo_replicas_hold_identical_state_after_every_step(mecefo_run):
    trace = mecefo_run.probe.trace
    for t in trace:
        assert t['mismatches'] == [], f"step {t['step']}: replicas differ in {t['mismatches']}"
    # ...and the state really lived on the live replicas only (device i = replica i).
    for t in trace:
        expected = frozenset(r for r, up in enumerate(t['live']) if up)
        assert t['devices'] == expected, (t['step'], sorted(t['devices']))
    assert [len(t['devices']) for t in trace] == [8, 8, 7, 7, 6, 6, 7, 7, 8, 8]
    assert replica_mismatches(mecefo_run.summary['state']) == []


def test_mecefo_events_logged_with_timings(mecefo_run):
    expected = [('failure', 2, [3], 7), ('failure', 4, [4], 6),
                ('recovery', 6, [4], 7), ('recovery', 8, [3], 8)]
    events = mecefo_run.summary['events']
    assert [(e['kind'], e['step'], e['replicas'], e['live']) for e in events] == expected
    rows = [r for r in mecefo_run.rows if r.get('event') in ('failure', 'recovery')]
    assert [(r['kind'], r['step'], r['replicas'], r['live']) for r in rows] == expected
    for r in rows:
        assert r['event'] == r['kind'] and r['clock'] == r['step']
        # Every event moved the state to another mesh and waited for the first
        # step on it, so both take measurable time.
        assert r['rebuild_sec'] > 0 and r['first_step_sec'] > 0, r
        # Detection is a lookup in the host's schedule (one process: no
        # broadcast): microseconds. 0.5 s would mean it went wrong, e.g. a
        # blocking collective or a device sync crept in.
        assert 0 < r['detect_sec'] < 0.5, r
        # MeCeFO restores nothing from disk and redoes nothing.
        assert r['lost_steps'] == 0 and r['restore_sec'] == 0
    # Recoveries return to meshes seen before: no compilation at all. (The
    # failures' compile times are checked against the cache in
    # test_mecefo_recovers_to_full_mesh_without_recompiling.)
    assert [r['compile_sec'] for r in rows if r['kind'] == 'recovery'] == [0.0, 0.0]
    # The SVD refresh is charged: on every event that recomputed V (the two
    # onsets, and the recovery at step 6, a tau multiple with 3 still down),
    # and nowhere else; the tau-only refresh at step 3 is counted in the total.
    refreshed_at = set(mecefo_run.summary['refresh_steps'])
    for e in events:
        assert (e['refresh_sec'] > 0) == (e['step'] in refreshed_at), e
    s = mecefo_run.summary
    event_refresh = sum(e['refresh_sec'] for e in events)
    assert s['refresh_sec'] > event_refresh > 0  # step 3 was refreshed between events
    # ...and it is part of the measured overhead the modelled time adds.
    assert s['measured_overhead_sec'] >= s['refresh_sec']
    scheduled = [(r['step'], r['replica'], r['duration_steps'])
                 for r in mecefo_run.rows if r.get('event') == 'scheduled_failure']
    assert scheduled == [(2, 3, 6), (4, 4, 2)]
    replicas = [(r['step'], r['replicas']) for r in mecefo_run.rows if 'replicas' in r
                and 'loss' in r]
    assert replicas == [(s + 1, 7 if s in (2, 3, 6, 7) else 6 if s in (4, 5) else 8)
                        for s in range(STEPS)]


def test_mecefo_layouts_follow_the_ring_neighbour_rule(mecefo_run):
    for t in mecefo_run.probe.trace:
        live = MECEFO_MASKS.get(t['step'], mask())
        assert t['live'] == live
        assert t['layout'] == layout_for('mecefo', live, B), t['step']
        neighbours = {r for r, role in zip(t['layout'].replicas, t['layout'].roles)
                      if role == ROLE_NEIGHBOUR}
        adopted = {p.shard: r for r, pieces in zip(t['layout'].replicas, t['layout'].pieces)
                   for p in pieces if p.shard != r}
        if live == mask(3):
            assert adopted == {3: 4} and neighbours == {4}
        elif live == mask(3, 4):  # the adopter 4 failed while adopting 3
            assert adopted == {3: 2, 4: 5} and neighbours == {2, 5}
        else:
            assert t['layout'] == full_layout(N, B)
        # What the step reports back: every token counted; attention only from
        # shards computed by normal replicas (the neighbour's own + adopted).
        assert t['tokens'] == N * TOKENS_PER_SHARD
        normal_shards = N - sum(len(pieces) for r, pieces in zip(t['layout'].replicas,
                                                                 t['layout'].pieces)
                                if r in neighbours)
        assert t['attn_tokens'] == normal_shards * TOKENS_PER_SHARD, t['step']
    by_step = {t['step']: t for t in mecefo_run.probe.trace}
    assert by_step[2]['attn_tokens'] == 6 * TOKENS_PER_SHARD
    assert by_step[4]['attn_tokens'] == 4 * TOKENS_PER_SHARD


def test_mecefo_recovers_to_full_mesh_without_recompiling(mecefo_run):
    s = mecefo_run.summary
    final = s['state']
    assert devices_of(final) == frozenset(range(N))
    assert mecefo_run.probe.trace[-1]['layout'] == full_layout(N, B)
    events = s['events']
    # Recoveries return to topologies seen before: nothing is compiled.
    assert [e['compile_sec'] for e in events[2:]] == [0.0, 0.0]
    expected_compiles = sum(not done for done in mecefo_run.precompiled.values())
    assert s['compiles'] == expected_compiles
    for event, done in zip(events[:2], mecefo_run.precompiled.values()):
        assert (event['compile_sec'] > 0) == (not done)


def _neighbour_steps(trace):
    return [t['step'] for t in trace if ROLE_NEIGHBOUR in t['layout'].roles]


def test_v_refresh_at_onsets_and_tau_multiples_only(mecefo_run):
    trace = mecefo_run.probe.trace
    refresh = mecefo_run.summary['refresh_steps']
    onsets = [2, 4]
    active = _neighbour_steps(trace)
    assert active == [2, 3, 4, 5, 6, 7]
    allowed = set(onsets) | {s for s in active if s % MECEFO_TAU == 0}
    transitions = {e['step'] for e in mecefo_run.summary['events']}
    assert refresh == sorted(set(refresh)), refresh
    assert set(onsets) <= set(refresh) <= allowed, refresh
    assert {s for s in active if s % MECEFO_TAU == 0 and s not in transitions} <= set(refresh)
    # The refresh really recomputed V: projections change exactly at refresh steps.
    for prev, cur in zip(trace, trace[1:]):
        changed = not tree_equal(prev['state_after'].projections, cur['state_after'].projections)
        assert changed == (cur['step'] in refresh), cur['step']


def test_v_refresh_exactly_onsets_and_tau_multiples_while_neighbour_active(mecefo_run):
    active = _neighbour_steps(mecefo_run.probe.trace)
    expected = sorted({2, 4} | {s for s in active if s % MECEFO_TAU == 0})
    assert mecefo_run.summary['refresh_steps'] == expected  # [2, 3, 4, 6]


def test_observers_see_every_step_and_event_and_do_not_change_training(
        mecefo_run, cache_dir, topologies, tmp_path):
    s, probe = mecefo_run.summary, mecefo_run.probe
    assert [t['step'] for t in probe.trace] == list(range(STEPS))
    # Every event reaches observers, timed (first step included), as the summary has it.
    assert probe.events == s['events'] and len(s['events']) == 4
    assert all(e['first_step_sec'] > 0 for e in probe.events)
    # The gradient probe ran: neighbour-mode steps 2..7, every 3rd of them
    # (steps 2 and 5), one sample per neighbour (one at step 2, two at 5).
    assert [(g['step'], g['replica']) for g in s['grad_errors']] == [(2, 4), (5, 2), (5, 5)]
    # The same run without any observer trains bit for bit the same.
    workdir = str(tmp_path)
    run = dataclasses.replace(run_setup.build_run(mecefo_run.cfg, workdir),
                              topologies=topologies)
    bare = run_lib.run(mecefo_run.cfg, workdir, run=run)
    assert 'grad_errors' not in bare and 'useful_tokens' not in bare

    def curve(rows):
        keys = ('step', 'loss', 'grad_norm', 'val_loss', 'val_ppl', 'replicas')
        return [{k: r[k] for k in keys if k in r} for r in rows
                if 'loss' in r or 'val_loss' in r]
    assert curve(read_metrics(workdir)) == curve(mecefo_run.rows)
    assert len(curve(mecefo_run.rows)) == STEPS + 1  # every step, and the final eval
    assert tree_equal(jax.device_get(bare['state']), jax.device_get(s['state']))


# ------------------------------------------------------ checkpoint/restart


def test_checkpoint_restart_redoes_lost_steps(restart_run):
    s = restart_run.summary
    assert s['final_step'] == STEPS and s['executed_steps'] == STEPS + 2
    failure, recovery = s['events']
    assert (failure['kind'], failure['clock'], failure['step']) == ('failure', 6, 6)
    assert failure['lost_steps'] == 2 and s['lost_steps'] == 2
    assert failure['restore_sec'] > 0 and failure['relaunch_sec_modelled'] == 42.0
    assert s['relaunch_sec_modelled'] == 42.0 * 2  # a relaunch for the rejoin too
    assert recovery['kind'] == 'recovery' and recovery['lost_steps'] == 0
    assert restart_run.probe.events == s['events']
    steps = [t['step'] for t in restart_run.probe.trace]
    assert steps == [0, 1, 2, 3, 4, 5, 4, 5, 6, 7, 8, 9]
    assert [t['clock'] for t in restart_run.probe.trace] == list(range(STEPS + 2))
    assert np.isfinite([t['loss'] for t in restart_run.probe.trace]).all()
    assert s['useful_tokens'] == STEPS * N * TOKENS_PER_SHARD
    for t in restart_run.probe.trace:
        assert t['mismatches'] == []
        assert t['layout'] == layout_for('checkpoint_restart', t['live'], B)
        assert set(t['layout'].roles) == {ROLE_NORMAL}


def test_checkpoint_restart_restores_the_exact_saved_state(restart_run):
    trace = restart_run.probe.trace
    (clock, step, restored), (clock2, step2, rejoined) = restart_run.probe.restored
    assert (clock, step) == (6, 4)
    # The state saved at step 4 is the state after the first pass's step 3.
    saved = next(t['state_after'] for t in trace if t['clock'] == 3)
    assert int(restored.step) == 4
    assert tree_equal(restored, saved)  # params, optimizer state, V and step, bitwise
    # The data iterator rewinds too: the redone steps see the same batches.
    hashes = restart_run.run.train_data.hashes
    assert hashes[6:8] == hashes[4:6] and len(set(hashes[:6])) == 6
    assert len(hashes) == STEPS + 2
    # The rejoin restores the state it saved a moment before: nothing lost.
    assert (clock2, step2) == (9, 7)
    assert tree_equal(rejoined, next(t['state_after'] for t in trace if t['clock'] == 8))


# ------------------------------------------------------------ all strategies


@pytest.mark.parametrize('strategy', STRATEGIES)
def test_every_strategy_completes_failure_and_recovery(strategy, strategy_runs):
    result = strategy_runs(strategy)
    s = result.summary
    planner = config_planner(get_config(), B)  # the run's config differs in fault.* only
    assert s['strategy'] == strategy
    assert s['final_step'] == STEPS
    assert np.isfinite(s['final_loss']) and np.isfinite(s['final_val_loss'])
    kinds = [e['kind'] for e in s['events']]
    assert kinds[0] == 'failure' and kinds[-1] == 'recovery'
    assert devices_of(s['state']) == frozenset(range(N))
    for t in result.probe.trace:
        assert t['mismatches'] == [], (strategy, t['step'], t['mismatches'])
        assert t['layout'] == layout_for(strategy, t['live'], B, planner=planner)
        assert np.isfinite(t['loss'])
    full_tokens = STEPS * N * TOKENS_PER_SHARD
    if strategy == 'drop':  # shard 3 skipped for 3 steps
        assert s['useful_tokens'] == full_tokens - 3 * TOKENS_PER_SHARD
        assert [t['tokens'] for t in result.probe.trace][2:5] == [(N - 1) * TOKENS_PER_SHARD] * 3
    else:
        assert s['useful_tokens'] == full_tokens
    if SPECS[strategy].neighbour_mode:
        assert s['refresh_steps'] and s['refresh_steps'][0] == s['events'][0]['step']
        assert any(ROLE_NEIGHBOUR in t['layout'].roles for t in result.probe.trace)
    else:
        assert s['refresh_steps'] == []
        assert all(set(t['layout'].roles) == {ROLE_NORMAL} for t in result.probe.trace)


def test_planned_splits_failed_shard_over_its_two_ring_neighbours(strategy_runs):
    # Tiny's analytic costs: one extra row each keeps a helper at 1.02x, the
    # best any plan can do with 2 rows per shard; the two nearest take them.
    during = [t for t in strategy_runs('mecefo_planned').probe.trace if not all(t['live'])]
    layout = during[0]['layout']
    helpers = {r: sum(p.size for p in pieces if p.shard == 3)
               for r, pieces in zip(layout.replicas, layout.pieces)}
    assert {r: n for r, n in helpers.items() if n} == {2: 1, 4: 1}
    assert {r for r, role in zip(layout.replicas, layout.roles) if role} == {2, 4}
    assert [t['step'] for t in during] == [2, 3, 4]
    # Attention gradients come only from the five replicas left in normal role.
    assert during[0]['attn_tokens'] == (N - 3) * TOKENS_PER_SHARD
    assert during[0]['tokens'] == N * TOKENS_PER_SHARD


# ------------------------------------------------------------- bad schedules


@pytest.fixture(scope='module')
def plain_run(cache_dir, topologies, tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp('bad_schedules'))
    run = run_setup.build_run(config(cache_dir), workdir)
    return dataclasses.replace(run, topologies=topologies), workdir


@pytest.mark.parametrize('events, message', [
    ('2:8:1', r"fault\.events: event '2:8:1' names replica 8, but there are 8 replicas"),
    ('2:3:-1', r"fault\.events: event '2:3:-1' has duration -1"),
    ('2:3:0', r'outage length must be at least 1 step'),
    (f'{STEPS}:3:2', rf'starts at step {STEPS}, but the run has only {STEPS} steps'),
    ('-1:3:2', r'failure steps must be >= 0'),
    ('2:3', r'malformed entry'),
    ('2:3:4,4:3:2', r'replica 3 fails again at step 4'),
])
def test_bad_schedules_give_clear_errors(events, message, cache_dir, plain_run):
    # Unchecked on purpose: resolve refuses malformed events earlier (config_test).
    cfg = unchecked(config(cache_dir), events=events)
    with pytest.raises(ValueError, match=message):
        schedule_lib.events_from_config(cfg.fault, num_replicas=N, total_steps=STEPS)
    run, workdir = plain_run
    with pytest.raises(ValueError, match=message):
        run_lib.run(cfg, workdir, run=run)


# ------------------------------------------------------------ all replicas down


def test_all_replicas_down_stops_with_checkpoint(cache_dir, topologies, tmp_path):
    events = ','.join(f'1:{r}:2' for r in range(N))
    cfg = config(cache_dir, strategy='mecefo', events=events)
    workdir = str(tmp_path)
    probe = Probe()
    run = dataclasses.replace(run_setup.build_run(cfg, workdir, checkpoint_every=100),
                              topologies=topologies)
    try:
        with pytest.raises(AllReplicasDownError,
                           match=r'Every one of the 8 replicas is down at step 1 '
                                 r'\(saved step 1 to .*checkpoints\)') as info:
            run_lib.run(cfg, workdir, run=run, observers=[probe])
        assert 'fault.events' in str(info.value)
        assert run.checkpointer.all_steps() == [1]
        restored, data_state = resume.restore_onto(
            run, run.checkpointer, run.topologies.get(run.full_rows))
        assert int(restored.step) == 1
        assert tree_equal(jax.device_get(restored), probe.trace[0]['state_after'])
        assert isinstance(data_state, dict) and data_state
    finally:
        run.checkpointer.close()


def test_a_relaunch_charges_loading_the_refresh_program_to_compile_not_refresh(monkeypatch):
    """With the program cache on (a launcher's worker), the refresh program is loaded before
    the refresh is timed; without it the refresh stays a plain jitted call."""
    from mecefo_jax.faults import controller
    from mecefo_jax.parallel import program_cache

    class Refresh:
        def __init__(self):
            self.compiled_for = []

        def compile(self, *args):
            self.compiled_for.append(args)

    topology = dataclasses.make_dataclass('Topology', ['refresh'])(Refresh())
    monkeypatch.setattr(program_cache, 'enabled', lambda: False)
    assert controller._load_refresh(topology, 'state') == 0.0
    assert topology.refresh.compiled_for == []
    monkeypatch.setattr(program_cache, 'enabled', lambda: True)
    assert controller._load_refresh(topology, 'state') >= 0.0
    assert topology.refresh.compiled_for == [('state',)]
