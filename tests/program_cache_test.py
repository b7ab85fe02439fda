"""The program cache: a program stored once loads instead of compiling, and computes the same."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mecefo_jax import program_cache


@pytest.fixture
def cache(tmp_path):
    program_cache.enable(str(tmp_path))
    program_cache.stats = program_cache.Stats()
    yield tmp_path
    program_cache.disable()


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
    program_cache.disable()
    compiled = program_cache.compile(_lowered(), jax.devices()[:1], 'f')
    assert compiled(np.ones((4, 3), np.float32)).shape == (4, 4)
    assert not list(tmp_path.iterdir())
