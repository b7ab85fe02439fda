"""End-to-end training on the tiny config: learning, exact resume, NaN stop."""
import os

import jax
import numpy as np
import pytest

from configs.tiny import get_config
from mecefo_jax.checkpointing import checkpoint as ckpt_lib
from mecefo_jax.config.resolve import resolve
from mecefo_jax.training import loop as train_lib
from mecefo_jax.training import resume, run_setup
from mecefo_jax.training.metrics import read_metrics

STEPS = 12


@pytest.fixture(scope='module')
def cache_dir(tokenizer_cache):
    return tokenizer_cache  # the session's (tests/conftest.py)


def tiny(cache_dir, **train):
    cfg = get_config()
    cfg.data.cache_dir = cache_dir
    cfg.train.steps = STEPS
    cfg.train.log_every = 1
    cfg.train.eval_every = 0
    cfg.train.checkpoint_every = 0
    for key, value in train.items():
        cfg.train[key] = value
    return resolve(cfg)


def params_of(summary):
    return jax.device_get(summary['state'].params)


@pytest.fixture(scope='module')
def straight_run(cache_dir, tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp('straight'))
    return train_lib.train(tiny(cache_dir), workdir), workdir


def test_loss_falls_and_metrics_rows(straight_run):
    summary, workdir = straight_run
    rows = read_metrics(workdir)
    losses = [r['loss'] for r in rows if 'loss' in r]
    assert len(losses) == STEPS
    assert all(np.isfinite(losses))
    # Warmup is 10% of 12 steps, so the LR is high after step 2; 12 steps of
    # AdamW on a 2-layer model fall well below the ~log(256)=5.5 start.
    assert np.mean(losses[-3:]) < losses[0] - 0.5, losses
    assert all('tokens_per_sec' in r for r in rows if 'loss' in r)
    evals = [r for r in rows if 'val_loss' in r]
    assert evals and evals[-1]['step'] == STEPS  # the final step always evaluates
    assert np.isclose(evals[-1]['val_ppl'], np.exp(evals[-1]['val_loss']), rtol=1e-6)
    assert summary['final_step'] == STEPS


def test_resume_equals_uninterrupted(straight_run, cache_dir, tmp_path, capsys):
    half = STEPS // 2
    workdir = str(tmp_path)
    first = train_lib.train(tiny(cache_dir, checkpoint_every=half), workdir, stop_at=half)
    assert first['final_step'] == half
    assert 'resumed' not in capsys.readouterr().out  # a fresh start says nothing of it
    resumed = train_lib.train(tiny(cache_dir, checkpoint_every=half), workdir)
    assert resumed['start_step'] == half
    # The restart says so, on the console and in metrics.jsonl.
    assert f'resumed from step {half} (disk)' in capsys.readouterr().out
    rows = read_metrics(workdir)
    assert {'event': 'resumed', 'step': half, 'source': 'disk'} in rows
    assert [r['step'] for r in rows if 'loss' in r] == list(range(1, STEPS + 1))
    expected = params_of(straight_run[0])
    # Same compiled program, same data order, exactly restored state and data
    # iterator: the trajectories must agree to the last bit on CPU.
    for a, b in zip(jax.tree.leaves(params_of(resumed)), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('log_every', [1, 5])
def test_non_finite_loss_stops_after_saving_last_good_state(cache_dir, tmp_path, log_every):
    # An absurd learning rate without clipping blows the parameters up in a
    # couple of steps; the step guard must keep the last finite state. With
    # log_every=5 the loop reads metrics only every 5 steps, so the bad step
    # is found among steps already dispatched after it.
    cfg = tiny(cache_dir, learning_rate=1e30, grad_clip=0.0, warmup_fraction=0.0,
               checkpoint_every=100, log_every=log_every)
    with pytest.raises(train_lib.NonFiniteLossError, match='learning_rate'):
        train_lib.train(cfg, str(tmp_path))
    ckpt = ckpt_lib.Checkpointer(os.path.join(tmp_path, 'checkpoints'), save_every=100)
    step = ckpt.latest_step()
    assert step is not None and 0 < step < STEPS
    run = run_setup.build_run(cfg, str(tmp_path / 'probe'))
    state, data_state = resume.restore_onto(run, ckpt, run.topologies.get(run.full_rows))
    assert int(state.step) == step
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state.params))
    ckpt.close()
    # The saved data position belongs to the saved state: resuming feeds the
    # failed step's batch again, not the one after it. The reference is a
    # fresh pipeline advanced by the `step` batches the good steps consumed.
    reference = run_setup.build_run(cfg, str(tmp_path / 'reference')).train_data
    for _ in range(step):
        next(reference)
    failed_batch = next(reference)
    run.train_data.set_state(data_state)
    np.testing.assert_array_equal(next(run.train_data), failed_batch)
