"""The program cache: a program stored once loads instead of compiling, and computes the same."""
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mecefo_jax.parallel import program_cache


@pytest.fixture
def cache(tmp_path):
    program_cache.enable(str(tmp_path))
    program_cache.stats = program_cache.Stats()
    yield tmp_path
    program_cache.enable('')


def _lowered():
    return jax.jit(lambda x: jnp.tanh(x) @ x.T).lower(jax.ShapeDtypeStruct((4, 3), jnp.float32))


def test_a_second_compile_of_the_same_program_is_a_hit_that_computes_the_same(cache):
    x = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
    first = program_cache.compile(_lowered(), jax.devices()[:1], 'f')
    second = program_cache.compile(_lowered(), jax.devices()[:1], 'f')
    assert (program_cache.stats.misses, program_cache.stats.hits) == (1, 1)
    np.testing.assert_array_equal(np.asarray(first(x)), np.asarray(second(x)))
    assert len(list(cache.glob('f-*.bin'))) == 1


def test_a_damaged_entry_is_compiled_again_with_a_warning(cache):
    program_cache.compile(_lowered(), jax.devices()[:1], 'f')
    (entry,) = cache.glob('f-*.bin')
    entry.write_bytes(b'not an executable')
    with pytest.warns(UserWarning, match='could not load'):
        program_cache.compile(_lowered(), jax.devices()[:1], 'f')
    assert program_cache.stats.misses == 2


def test_disabled_it_compiles_and_stores_nothing(tmp_path):
    program_cache.enable('')
    compiled = program_cache.compile(_lowered(), jax.devices()[:1], 'f')
    assert compiled(np.ones((4, 3), np.float32)).shape == (4, 4)
    assert not list(tmp_path.iterdir())


def _counting_jit(traces, op=jnp.tanh):
    def f(x):
        traces.append(1)  # runs only while tracing
        return op(x) @ x.T
    return jax.jit(f)


def test_with_a_context_a_stored_program_loads_without_tracing_and_computes_the_same(tmp_path):
    program_cache.enable(str(tmp_path), context='config A')
    program_cache.stats = program_cache.Stats()
    try:
        x = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
        args = (jax.ShapeDtypeStruct((4, 3), jnp.float32),)
        traces = []
        first = program_cache.load_or_compile(_counting_jit(traces), args, jax.devices()[:1], 'f')
        again = program_cache.load_or_compile(_counting_jit(traces), args, jax.devices()[:1], 'f')
        assert len(traces) == 1 and program_cache.stats.untraced_hits == 1
        np.testing.assert_array_equal(np.asarray(first(x)), np.asarray(again(x)))
        # Another identity, other inputs or another context are other programs: traced.
        program_cache.load_or_compile(_counting_jit(traces), args, jax.devices()[:1], 'f',
                                      identity='layout 2')
        program_cache.load_or_compile(_counting_jit(traces),
                                      (jax.ShapeDtypeStruct((4, 5), jnp.float32),),
                                      jax.devices()[:1], 'f')
        program_cache.enable(str(tmp_path), context='config B')
        program_cache.load_or_compile(_counting_jit(traces), args, jax.devices()[:1], 'f')
        assert len(traces) == 4 and program_cache.stats.untraced_hits == 1
    finally:
        program_cache.enable('')


def test_a_damaged_untraced_entry_is_traced_again_with_a_warning(tmp_path):
    # A program no other test builds: on CPU (jax 0.10.2) an executable loaded after the
    # same program was compiled and freed earlier in the process can fail to run
    # ("Function ... not found"); a worker loads each program once.
    program_cache.enable(str(tmp_path), context='config A')
    try:
        args = (jax.ShapeDtypeStruct((4, 3), jnp.float32),)
        traces = []
        program_cache.load_or_compile(_counting_jit(traces, jnp.cos), args, jax.devices()[:1], 'f')
        (entry,) = tmp_path.glob('f-untraced-*.bin')
        entry.write_bytes(b'not a pickle')
        with pytest.warns(UserWarning, match='could not load'):
            compiled = program_cache.load_or_compile(_counting_jit(traces, jnp.cos), args,
                                                     jax.devices()[:1], 'f')
        assert len(traces) == 2 and compiled(np.ones((4, 3), np.float32)).shape == (4, 4)
    finally:
        program_cache.enable('')


def test_the_source_fingerprint_is_part_of_the_context():
    from configs.tiny import get_config
    from mecefo_jax.config.resolve import resolve, updated
    cfg = resolve(get_config())
    context = program_cache.program_context(cfg)
    assert context.endswith(program_cache.source_fingerprint())
    # The launcher's and the snapshots' settings decide no program.
    assert program_cache.program_context(updated(cfg, {'launch.kill': '3:1'})) == context
    assert program_cache.program_context(updated(cfg, {'mecefo.rank': 3})) != context
    # Every module of the package counts, not only the cache's own folder: the step's
    # programs come from model/, neighbour/ and parallel/ alike.
    files = program_cache.source_files()
    assert {'model/llama.py', 'neighbour/layout.py', 'parallel/step.py', 'main.py'} <= set(files)


def test_the_loops_own_settings_leave_the_context_and_the_schedules_length_stays():
    """How long, how often to log, evaluate and save decide no program: a rerun that trains
    longer finds its programs untraced. `train.steps` still counts where it sets the
    learning-rate schedule's length (`lr_schedule_steps=0`)."""
    from configs.tiny import get_config
    from mecefo_jax.config.resolve import resolve, updated
    cfg = resolve(get_config())
    assert cfg.train.lr_schedule_steps > 0  # tiny: the schedule has a length of its own
    context = program_cache.program_context(cfg)
    host_only = {'train.steps': cfg.train.steps + 7, 'train.log_every': 1, 'train.eval_every': 3,
                 'train.eval_batches': 5, 'train.checkpoint_every': 2, 'train.keep_checkpoints': 9}
    for field, value in host_only.items():
        assert program_cache.program_context(updated(cfg, {field: value})) == context, field
    for field, value in {'train.lr_schedule_steps': 41, 'train.learning_rate': 0.5,
                         'train.ordered_reduction': not cfg.train.ordered_reduction}.items():
        assert program_cache.program_context(updated(cfg, {field: value})) != context, field
    own_schedule = updated(cfg, {'train.lr_schedule_steps': 0})
    assert (program_cache.program_context(updated(own_schedule, {'train.steps': 17}))
            != program_cache.program_context(own_schedule))


def _lowered_only_here():
    """A program no other test compiles, so JAX's session cache first sees it below."""
    return jax.jit(lambda x: jnp.sin(x) @ x.T * 3).lower(
        jax.ShapeDtypeStruct((4, 3), jnp.float32))


def test_a_program_in_jaxs_own_cache_is_stored_from_a_fresh_compile(cache):
    """Bytes re-serialised from an executable JAX loaded from its cache fail to run on CPU."""
    x = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
    assert jax.config.jax_compilation_cache_dir  # tests/conftest.py: JAX's persistent cache
    want = np.asarray(_lowered_only_here().compile()(x))  # now in JAX's cache too
    program_cache.compile(_lowered_only_here(), jax.devices()[:1], 'f')
    loaded = program_cache.compile(_lowered_only_here(), jax.devices()[:1], 'f')
    assert program_cache.stats.hits == 1
    np.testing.assert_array_equal(np.asarray(loaded(x)), want)


def _python(script: str, *argv: str):
    """`script` run by a fresh Python process in the repository: nothing compiled or run before."""
    import subprocess
    import sys
    return subprocess.run([sys.executable, '-c', script, *argv], cwd=str(Path(__file__).resolve().parents[1]),
                          capture_output=True, text=True, timeout=120)


_BAD_ENTRY = """
import json, pickle, sys, warnings
from pathlib import Path
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import serialize_executable
from mecefo_jax.parallel import program_cache
mode, directory = sys.argv[1], Path(sys.argv[2])
jax.config.update('jax_compilation_cache_dir', str(directory / 'jax'))
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
f = lambda x, y: (jnp.tanh(x) @ y.T + 1, y * 2)
args = (jax.ShapeDtypeStruct((4, 3), jnp.float32),) * 2
def lowered():  # a new function each time: JAX's cache on disk, not its memo, finds it
    return jax.jit(lambda x, y: f(x, y), donate_argnums=(1,)).lower(*args)
lowered().compile()  # into JAX's cache; run nothing before the entry's first call
bad = serialize_executable.serialize(lowered().compile())[0]  # from an executable JAX loaded
devices = jax.devices()[:1]
program_cache.enable(str(directory / 'programs'), context='bad entry' if mode == 'untraced' else '')
if mode == 'untraced':
    entry = directory / 'programs' / f"g-untraced-{program_cache.untraced_key('g:', args, devices)}.bin"
    program_cache._store_untraced(str(entry), bad, lowered())  # as a worker stores one
    program = program_cache.load_or_compile(jax.jit(f, donate_argnums=(1,)), args, devices, 'g')
    stored = lambda: pickle.loads(entry.read_bytes())[0]
else:
    entry = directory / 'programs' / f'g-{program_cache.program_key(lowered(), devices)}.bin'
    entry.write_bytes(bad)
    program = program_cache.compile(lowered(), devices, 'g')
    stored = entry.read_bytes
inputs = lambda: (jnp.arange(12, dtype=jnp.float32).reshape(4, 3) / 7, jnp.ones((4, 3)))
hits = program_cache.stats.hits
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    got = program(*inputs())  # y is donated: the failed call has deleted it
again = program(*inputs())
want = [np.asarray(a) for a in jax.jit(f)(*inputs())]  # only now: a kernel run here first
print(json.dumps({'hits': hits, 'misses': program_cache.stats.misses,
                  'warned': [str(w.message) for w in caught],
                  'same': all(np.array_equal(np.asarray(a), b) for a, b in zip(got, want)),
                  'again_same': all(np.array_equal(np.asarray(a), b) for a, b in zip(again, want)),
                  'stored_afresh': stored() != bad}))
"""


@pytest.mark.subprocess
@pytest.mark.parametrize('mode', ['lowered', 'untraced'])
def test_an_entry_that_fails_its_first_call_is_compiled_again_and_computes_the_same(
        mode, tmp_path):
    """What a fresh clone's cache once held (issue: "Function wrapped_tanh not found"):
    bytes serialised from an executable JAX had loaded from its own persistent cache.
    On CPU (jax 0.10.2) they load, then fail the first call with NOT_FOUND, having
    deleted the inputs it donates. The worker warns, compiles, calls again with the
    inputs kept for that call, stores the fresh bytes, and goes on. A fresh process:
    one that already ran a kernel of the same name finds that one instead."""
    import json
    run = _python(_BAD_ENTRY, mode, str(tmp_path))
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert out['hits'] == 1 and out['misses'] == 1, out
    (warning,) = out['warned']
    assert 'failed its first call' in warning and 'NOT_FOUND' in warning
    assert out['same'] and out['again_same'] and out['stored_afresh'], out


_FIRST_COMPILE_A_MISS = """
import os, sys
import jax, jax.numpy as jnp
from mecefo_jax.parallel import program_cache
jax.config.update('jax_compilation_cache_dir', sys.argv[1] + '/jax')
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
program_cache.enable(sys.argv[1] + '/programs')
spec = jax.ShapeDtypeStruct((4, 3), jnp.float32)
program_cache.compile(jax.jit(jnp.sin).lower(spec), jax.devices()[:1], 'f')  # compiled afresh
jax.jit(jnp.cos).lower(spec).compile()  # JAX's own path
print(sorted(name.split('-')[0] for name in os.listdir(sys.argv[1] + '/jax')))
"""


@pytest.mark.subprocess
def test_a_process_whose_first_compile_is_a_miss_keeps_jaxs_own_cache(tmp_path):
    """JAX decides once per process, at its first compile, whether its cache is used: a
    first compile made with it switched off (a miss here) switched it off for good."""
    run = _python(_FIRST_COMPILE_A_MISS, str(tmp_path))
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-1] == "['jit_cos']"


_LOAD_QR = """
import sys
import jax, jax.numpy as jnp, numpy as np
from mecefo_jax.parallel import program_cache
program_cache.enable(sys.argv[1], context='qr test')
spec = (jax.ShapeDtypeStruct((8, 4), jnp.float32),)
sine = program_cache.load_or_compile(jax.jit(lambda x: jnp.sin(x).sum()), spec, jax.devices()[:1], 'sin')
prepared = [program_cache._prepare_lapack.cache_info().currsize]
f = jax.jit(lambda x: jnp.linalg.qr(x)[0].sum())
c = program_cache.load_or_compile(f, spec, jax.devices()[:1], 'qr')
prepared.append(program_cache._prepare_lapack.cache_info().currsize)
print(*prepared, program_cache.stats.untraced_hits, float(sine(np.zeros((8, 4), np.float32))),
      float(c(np.eye(8, 4, dtype=np.float32))))
"""


@pytest.mark.subprocess
def test_a_program_calling_lapack_runs_when_loaded_untraced_in_a_fresh_process(tmp_path):
    """A fresh process that never lowered a LAPACK op crashed running one it loaded (SIGSEGV):
    it sets LAPACK up before loading one, and only then (0.3 CPU-s that a relaunched worker
    whose programs call none is spared)."""
    runs = [_python(_LOAD_QR, str(tmp_path)) for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-2000:]
    # Stored by the first process, found untraced by the second; Q of eye(8, 4) sums to 4.
    # The first process lowered both (LAPACK set up by JAX's own lowering, not by the cache).
    assert [r.stdout.split()[-5:] for r in runs] == [['0', '0', '0', '0.0', '4.0'],
                                                   ['0', '1', '2', '0.0', '4.0']]


def test_calls_lapack_names_the_programs_that_call_a_lapack_kernel():
    spec = jax.ShapeDtypeStruct((8, 4), jnp.float32)
    text = lambda f: jax.jit(f).lower(spec).as_text()  # noqa: E731
    assert program_cache.calls_lapack(text(lambda x: jnp.linalg.svd(x, full_matrices=False)))
    assert program_cache.calls_lapack(text(lambda x: jnp.linalg.qr(x)[0]))
    assert program_cache.calls_lapack(text(lambda x: jnp.linalg.eigh(x[:4] @ x[:4].T)[0]))
    assert not program_cache.calls_lapack(text(lambda x: jnp.sin(x) @ x.T))


def test_a_fresh_state_loads_without_tracing_and_equals_the_plain_init(tmp_path):
    """A fresh generation's workers find the init program before tracing it (a launcher's
    program cache); the state is the plain jit's bit for bit, and another seed is another program."""
    from configs import tiny
    from mecefo_jax.config.resolve import resolve
    from mecefo_jax.model.llama import build_model
    from mecefo_jax.model.optim import make_optimizer
    from mecefo_jax.parallel import sharding, state

    cfg = resolve(tiny.get_config())
    model, optimizer = build_model(cfg), make_optimizer(cfg.train)
    mesh = sharding.make_mesh(cfg.mesh)
    rank = cfg.mecefo.rank
    plain, shardings = state.create_train_state(model, optimizer, mesh, seed=3, rank=rank)
    program_cache.enable(str(tmp_path), context=program_cache.program_context(cfg))
    program_cache.stats = program_cache.Stats()
    try:
        first, _ = state.create_train_state(model, optimizer, mesh, seed=3, rank=rank, shardings=shardings)
        again, _ = state.create_train_state(model, optimizer, mesh, seed=3, rank=rank, shardings=shardings)
        assert program_cache.stats.untraced_hits == 1 and program_cache.stats.misses == 1
        for a, b, c in zip(jax.tree.leaves(plain), jax.tree.leaves(first), jax.tree.leaves(again)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
            np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
            assert a.sharding == c.sharding
        other, _ = state.create_train_state(model, optimizer, mesh, seed=4, rank=rank, shardings=shardings)
        assert program_cache.stats.untraced_hits == 1 and program_cache.stats.misses == 2
        assert not np.array_equal(np.asarray(jax.tree.leaves(other.params)[0]),
                                  np.asarray(jax.tree.leaves(plain.params)[0]))
    finally:
        program_cache.enable('')
