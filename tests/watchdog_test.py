"""The launcher's watchdog: which silence of a generation is a hang (no processes started).

Start, steps and the end are bounded separately: the start by
`launch.start_timeout_sec`, a step by `launch.stall_timeout_sec`, and the save
and exit after a generation's last step by `launch.stop_timeout_sec`. A slow
final save under load was once taken for a stuck collective, and a finished
job was torn down and run again.
"""
from types import SimpleNamespace

import pytest

from configs.tiny import get_config
from mecefo_jax.config.resolve import resolve, updated
from mecefo_jax.launch import launcher as launcher_lib
from mecefo_jax.launch.generation import Generation
from mecefo_jax.launch.launcher import Launcher

STEPS, START, STALL, STOP = 16, 30.0, 8.0, 20.0
NOW = 1000.0


@pytest.fixture
def launcher(tmp_path):
    cfg = updated(resolve(get_config()), {
        'train.steps': STEPS, 'mesh.data': 4, 'launch.local_devices': 2,
        'launch.start_timeout_sec': START, 'launch.stall_timeout_sec': STALL,
        'launch.stop_timeout_sec': STOP})
    return Launcher(cfg, str(tmp_path), 2, log=lambda _: None)


def generation(stop_at=0, ended=()):
    gen = Generation(1, [0, 1], 'memory', stop_at, started=NOW - 100.0)
    gen.ends = {w: {'finished': True} for w in ended}
    return gen


def test_a_generation_without_a_step_hangs_after_the_start_timeout(launcher):
    gen = generation()
    gen.started = NOW - START + 1.0
    assert launcher_lib.hung(launcher.job, gen, 0, 0.0, NOW) is None
    gen.started = NOW - START - 1.0
    assert 'of the start' in launcher_lib.hung(launcher.job, gen, 0, 0.0, NOW).cause


def test_a_step_that_never_completes_is_a_stall(launcher):
    assert launcher_lib.hung(launcher.job, generation(), 5, STALL - 1.0, NOW) is None
    hung = launcher_lib.hung(launcher.job, generation(), 5, STALL + 1.0, NOW)
    assert hung.cause.startswith('no step completed for') and hung.completed_steps == 5


@pytest.mark.parametrize('stop_at,last', [(0, STEPS), (10, 10)])  # the run's end, a planned stop
def test_after_the_last_step_the_end_gets_the_stop_timeout_not_the_stall_timeout(
        launcher, stop_at, last):
    assert launcher_lib.hung(launcher.job, generation(stop_at), last, (STALL + STOP) / 2, NOW) is None
    hung = launcher_lib.hung(launcher.job, generation(stop_at), last, STOP + 1.0, NOW)
    assert hung.cause == f'no end within {STOP:.1f} s of the last step'


def test_a_generation_whose_workers_all_ended_is_not_hung(launcher):
    assert launcher_lib.hung(launcher.job, generation(ended=(0, 1)), 5, STOP + STALL, NOW) is None


def test_an_actor_that_misses_the_start_timeout_fails_the_start_and_no_worker(
        launcher, monkeypatch):
    """A loaded host can take longer than `launch.start_timeout_sec` to start an actor:
    that start timed out (every worker is relaunched), unlike an actor Ray reports dead
    (its worker failed). No `run` starts in either case."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    from mecefo_jax.launch import generation as gen_module

    def get(answer, timeout):
        assert timeout == START
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(ray, 'get', get)
    for answers, dead, late in (([GetTimeoutError(), {'ip': 'x'}], [], [0]),
                                ([GetTimeoutError(), RayActorError()], [1], [0])):
        gen = generation()
        # A started actor per worker in turn, its `info` answer scripted: a dict, or what ray.get raises.
        started = iter(answers)

        def actor(env, answer_of=started):
            answer = next(answer_of)
            return SimpleNamespace(info=SimpleNamespace(remote=lambda: answer))
        monkeypatch.setattr(gen_module.placement_lib, 'actor_options', lambda **opts: opts)
        monkeypatch.setattr(ray, 'remote', lambda cls: SimpleNamespace(
            options=lambda **opts: SimpleNamespace(remote=actor)))
        assert gen_module.spawn(gen, args={}, nodes={0: 'a', 1: 'b'}, env={}, gpus={},
                                timeout=START) == (dead, late)
        assert gen.runs == {}
    timed_out = launcher_lib.start_timed_out(launcher.job, gen, gen.started + START + 0.5)
    assert timed_out.failed == [] and timed_out.cause == f'no step completed within {START:.1f} s of the start'
