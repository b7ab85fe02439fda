"""Nothing lost: preemption saves and resumes exactly, a rejected resume keeps the record,
a workdir with a run is never silently restarted, metrics keep one row per step."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from configs.tiny import get_config
from mecefo_jax.checkpointing import checkpoint as ckpt_lib
from mecefo_jax.config.resolve import resolve
from mecefo_jax.training import loop as train_lib
from mecefo_jax.training.metrics import read_metrics
from mecefo_jax.training.observers import Observer
from mecefo_jax.training.preemption import EXIT_PREEMPTED, Preempted, PreemptionGuard
from mecefo_jax.training.resume import WorkdirHoldsRunError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def cache_dir(tokenizer_cache):
    return tokenizer_cache  # the session's (tests/conftest.py)


def tiny(cache_dir, steps=8, **fields):
    cfg = get_config()
    cfg.data.cache_dir = cache_dir
    cfg.train.steps = steps
    cfg.train.log_every = 1
    cfg.train.eval_every = 0
    cfg.train.checkpoint_every = 100  # no periodic save: only what the test asks for
    for dotted, value in fields.items():
        section, name = dotted.split('.')
        cfg[section][name] = value
    return resolve(cfg)


def loss_steps(workdir):
    return [r['step'] for r in read_metrics(workdir) if 'loss' in r]


class SignalAt(Observer):
    """Sends this process `sig` once step `step` has been dispatched, as a scheduler would."""

    def __init__(self, step: int, sig=signal.SIGTERM):
        self.step, self.sig = step, sig

    def on_step(self, done) -> None:
        if done.step == self.step:
            os.kill(os.getpid(), self.sig)


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT], ids=['sigterm', 'ctrl_c'])
def test_a_signal_saves_the_next_step_and_the_rerun_resumes_there_with_one_row_per_step(
        cache_dir, tmp_path, sig, capsys):
    workdir = str(tmp_path)
    cfg = tiny(cache_dir)
    with PreemptionGuard() as guard, pytest.raises(Preempted) as stopped:
        train_lib.train(cfg, workdir, observers=[SignalAt(3, sig)], preemption=guard)
    # The signal lands during step 3; the loop stops before step 4, saving the
    # state entering it (steps 0..3 done), with the data position after batch 3.
    assert stopped.value.step == 4
    assert ckpt_lib.Checkpointer(os.path.join(workdir, 'checkpoints'), save_every=100) \
        .latest_step() == 4
    rows = read_metrics(workdir)
    assert rows[-1] == {'event': 'preempted', 'step': 4}
    summary = train_lib.train(cfg, workdir)
    assert summary['start_step'] == 4 and summary['final_step'] == 8
    assert 'resumed from step 4 (disk)' in capsys.readouterr().out
    assert loss_steps(workdir) == list(range(1, 9))  # one loss row per step, none twice
    assert {'event': 'resumed', 'step': 4, 'source': 'disk'} in read_metrics(workdir)


def test_a_second_ctrl_c_aborts_without_saving():
    with PreemptionGuard() as guard:
        os.kill(os.getpid(), signal.SIGINT)
        assert guard.requested(0)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


def test_a_rejected_resume_leaves_the_config_record_and_names_the_override(cache_dir, tmp_path):
    workdir = str(tmp_path)
    train_lib.train(tiny(cache_dir, steps=2, **{'train.checkpoint_every': 2}), workdir)
    record = open(os.path.join(workdir, 'config.json')).read()
    wider = tiny(cache_dir, steps=2, **{'train.checkpoint_every': 2, 'model.d_model': 64})
    with pytest.raises(ckpt_lib.CheckpointMismatchError, match=r'--config\.model\.d_model=32'):
        train_lib.train(wider, workdir)
    assert open(os.path.join(workdir, 'config.json')).read() == record


def test_a_run_with_nothing_to_resume_is_not_silently_restarted(cache_dir, tmp_path):
    workdir = str(tmp_path)
    cfg = tiny(cache_dir, steps=2, **{'train.checkpoint_every': 0})
    train_lib.train(cfg, workdir)
    with pytest.raises(WorkdirHoldsRunError, match='--workdir'):
        train_lib.train(cfg, workdir)
    assert loss_steps(workdir) == [1, 2]


def test_a_launchers_own_run_with_nothing_saved_starts_over_and_a_checkpoint_still_wins(
        cache_dir, tmp_path):
    """A launcher job killed before its first save: its rerun's workers (`own_run`, the job's
    config record fitting) hold nothing in memory and start over at step 0, one loss row per
    step and the same losses; where a checkpoint exists, it is restored instead."""
    from mecefo_jax.launch.placement import Placement
    from mecefo_jax.launch.worker import WorkerArgs
    from mecefo_jax.launch.worker_state import restore_fn
    from mecefo_jax.training.resume import Tier

    def own_run(workdir):
        restore, _ = restore_fn(WorkerArgs(cfg=None, workdir=workdir, placement=Placement(1, 1, 1),
                                           coordinator='', members=(0,), worker=0,
                                           resume=Tier.FRESH, own_run=True))
        return restore
    workdir = str(tmp_path / 'nothing_saved')
    cfg = tiny(cache_dir, steps=3, **{'train.checkpoint_every': 0})
    first = train_lib.train(tiny(cache_dir, steps=2, **{'train.checkpoint_every': 0}), workdir)
    train_lib.train(cfg, workdir, restore=own_run(workdir))
    rows = read_metrics(workdir)
    assert {'event': 'resumed', 'step': 0, 'source': 'start_over', 'dropped_through': 2} in rows
    assert loss_steps(workdir) == [1, 2, 3]
    assert [r['loss'] for r in rows if r.get('step') == 2 and 'loss' in r] == [first['final_loss']]
    saved = str(tmp_path / 'saved')
    train_lib.train(tiny(cache_dir, steps=2, **{'train.checkpoint_every': 2}), saved)
    train_lib.train(tiny(cache_dir, steps=3, **{'train.checkpoint_every': 2}), saved,
                    restore=own_run(saved))
    assert {'event': 'resumed', 'step': 2, 'source': 'disk'} in read_metrics(saved)
    assert loss_steps(saved) == [1, 2, 3]


@pytest.mark.subprocess
def test_sigterm_to_main_exits_preempted_and_the_rerun_resumes_exactly(cache_dir, tmp_path):
    workdir = str(tmp_path / 'run')
    args = [sys.executable, '-m', 'mecefo_jax.main', '--config',
            os.path.join(REPO, 'configs', 'tiny.py'), f'--workdir={workdir}',
            '--config.train.log_every=1', '--config.train.eval_every=0',
            '--config.train.checkpoint_every=1000', f'--config.data.cache_dir={cache_dir}']
    main = subprocess.Popen(args + ['--config.train.steps=2000'], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = os.path.join(workdir, 'metrics.jsonl')
    # Training has begun once a loss row exists: the step it lands on does not matter,
    # only that the save and the resume agree on it.
    while not (os.path.exists(metrics) and '"loss"' in open(metrics).read()):
        assert main.poll() is None, main.communicate()[0]
        time.sleep(0.05)
    main.send_signal(signal.SIGTERM)
    output = main.communicate(timeout=600)[0]
    assert main.returncode == EXIT_PREEMPTED, output
    preempted = json.loads(open(metrics).read().splitlines()[-1])
    assert preempted['event'] == 'preempted'
    saved = preempted['step']
    assert f'preempted: saved step {saved}' in output
    rerun = subprocess.run(args + [f'--config.train.steps={saved + 2}'], cwd=REPO,
                           capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert f'resumed from step {saved} (disk)' in rerun.stdout
    assert loss_steps(workdir) == list(range(1, saved + 3))


class _SlotPins(Observer):
    """The pins on a keeper's slots when each step is planned (the restore is done by then)."""

    def __init__(self, keeper):
        self.keeper, self.pins = keeper, []

    def on_plan(self, planned) -> None:
        self.pins.append(sum(slot.pins for slot in self.keeper.keeper._slots))  # noqa: SLF001


def test_a_run_restored_from_a_keeper_leaves_no_slot_pinned(cache_dir, tmp_path):
    """A worker restored from its keeper's shared memory trains on: the slot it read from is
    free again as soon as the restore is done, so the keeper can overwrite it at its next
    snapshot, whatever becomes of the restored arrays (on CPU a placed host array would
    alias the slot; the restore copies it)."""
    from mecefo_jax.launch.worker_state import SnapshotHook, keeper_restore
    from mecefo_jax.snapshot.client import KeeperClient
    from mecefo_jax.snapshot.keeper_actor import LocalKeeper
    with LocalKeeper('pins', slots=2) as keeper:
        hook = SnapshotHook(KeeperClient(keeper), 1)
        train_lib.train(tiny(cache_dir, steps=2), str(tmp_path / 'first'), observers=[hook])
        hook.close()
        pins = _SlotPins(keeper)
        info = {}
        train_lib.train(tiny(cache_dir, steps=4), str(tmp_path / 'restored'), observers=[pins],
                        restore=keeper_restore([keeper], 0, info, step=2))
        assert info['restore'].step == 2 and info['restore'].bytes_by_source
        assert pins.pins == [0, 0]  # steps 3 and 4: nothing pinned from the restore on
