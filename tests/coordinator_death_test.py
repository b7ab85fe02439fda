"""Deaths told apart by cause: a worker JAX ended because a peer died is that death's echo.

When a process of a `jax.distributed` job dies (worker 0 hosts its
coordinator), JAX's runtime terminates healthy processes too, printing
JAX_ABORT_MARKER to their logs; the CPU collectives' transport (gloo) may end
them too, printing GLOO_ABORT_MARKER. Such a worker is relaunched as a survivor
with its own keeper's snapshots, not recorded as failed. (No processes here:
the launcher's classification of deaths it has been told about.)
"""
import pytest

from configs.tiny import get_config
from mecefo_jax.config.resolve import resolve, updated
from mecefo_jax.launch import generation
from mecefo_jax.launch import launcher as launcher_lib
from mecefo_jax.launch.generation import ABORTED_BY_JAX, CRASH, PROGRAM_ERROR, Death, Generation
from mecefo_jax.launch.launcher import Launcher

JAX_TERMINATING = ('F external/xla/xla/pjrt/distributed/client.cc] Terminating process '
                   'because the JAX distributed service detected fatal errors. This most '
                   'likely indicates that another task died; see the other task logs.\n')
# A healthy worker of the tiny crash drill, 0.16 s after its peer was SIGKILLed.
GLOO_TERMINATING = ('logging.cc:118: Unhandled exception: N4gloo13EnforceNotMetE. what(): '
                    '[enforce fail at external/gloo/gloo/transport/tcp/pair.cc:459] '
                    'op.preamble.length <= op.nbytes. 8 vs 4\n*** SIGABRT received ***\n')


@pytest.fixture
def launcher(tmp_path):
    cfg = updated(resolve(get_config()), {'mesh.data': 4, 'launch.local_devices': 1})
    return Launcher(cfg, str(tmp_path), 4, log=lambda _: None)


def test_a_log_ending_in_jax_terminating_the_process_is_an_abort(tmp_path):
    log = tmp_path / 'g0_w2.log'
    log.write_text('step 5\n' * 20_000 + JAX_TERMINATING)  # past the tail's 64 KiB: the end counts
    assert generation.aborted_by_jax(str(log))
    log.write_text('step 5\n' + GLOO_TERMINATING)
    assert generation.aborted_by_jax(str(log))
    log.write_text('step 5\nTraceback (most recent call last):\nValueError: boom\n')
    assert not generation.aborted_by_jax(str(log))
    assert not generation.aborted_by_jax(str(tmp_path / 'missing.log'))


def test_the_coordinators_death_fails_it_alone_and_the_workers_jax_ended_survive(launcher):
    """Worker 0 SIGKILLed, worker 3 killed 0.3 s later, worker 2 ended by JAX in the same
    settle window: two failures told apart by cause, and one echo relaunched as a survivor."""
    gen = Generation(0, [0, 1, 2, 3], 'fresh', 0, started=990.0)
    deaths = [Death(0, 'its process died', CRASH, 1000.0),
              Death(2, ABORTED_BY_JAX, CRASH, 1000.2),
              Death(3, 'its process died', CRASH, 1000.3)]
    result = launcher_lib.failed(launcher.job, gen, deaths, 1001.0)
    assert result.kind == 'failed' and result.failed == [0, 3]
    assert result.echoes == {'2': ABORTED_BY_JAX}
    assert result.cause == 'worker 0: its process died; worker 3: its process died'


def test_aborts_alone_are_the_failure_when_no_other_death_explains_them(launcher):
    gen = Generation(0, [0, 1], 'fresh', 0, started=990.0)
    deaths = [Death(1, ABORTED_BY_JAX, CRASH, 1000.0)]
    result = launcher_lib.failed(launcher.job, gen, deaths, 1001.0)
    assert result.kind == 'failed' and result.failed == [1] and result.echoes == {}


def test_a_program_error_beside_a_crash_is_still_its_echo(launcher):
    gen = Generation(0, [0, 1, 2], 'fresh', 0, started=990.0)
    deaths = [Death(0, 'its process died', CRASH, 1000.0),
              Death(1, 'RuntimeError: collective failed', PROGRAM_ERROR, 1000.1),
              Death(2, ABORTED_BY_JAX, CRASH, 1000.2)]
    result = launcher_lib.failed(launcher.job, gen, deaths, 1001.0)
    assert result.failed == [0]
    assert result.echoes == {'1': 'RuntimeError: collective failed', '2': ABORTED_BY_JAX}


def test_echoes_alone_wait_for_the_death_they_echo(launcher, monkeypatch):
    """A node's loss is reported a second or two after the survivors' aborts (a chaos
    soak's node loss): with only echoes seen, the launcher waits, up to the grace, for a
    death that explains them, and then tells them apart; after the grace, the echoes
    themselves are the failure."""
    monkeypatch.setattr(launcher_lib.time, 'sleep', lambda _: None)
    later = []
    monkeypatch.setattr(launcher_lib.generation, 'exits', lambda *a, **k: later)
    gen = Generation(0, [0, 1, 2, 3], 'fresh', 0, started=990.0)
    echoes = [Death(1, ABORTED_BY_JAX, CRASH, 1000.0), Death(2, ABORTED_BY_JAX, CRASH, 1000.1)]
    assert not launcher_lib.decided(launcher.job, gen, list(echoes), 1001.0)
    node = [Death(0, 'its node died', CRASH, 1001.5), Death(3, 'its node died', CRASH, 1001.5)]
    deaths = echoes + node
    assert launcher_lib.decided(launcher.job, gen, deaths, 1002.0)
    result = launcher_lib.failed(launcher.job, gen, deaths, 1002.0)
    assert result.failed == [0, 3] and set(result.echoes) == {'1', '2'}
    alone = Generation(1, [0, 1, 2, 3], 'memory', 0, started=990.0)
    assert launcher_lib.decided(launcher.job, alone, list(echoes), 1000.0 + launcher_lib._ERROR_GRACE_SEC + 1)
