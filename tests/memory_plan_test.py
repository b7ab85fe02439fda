"""Tests for studies.memory_plan and scripts/memory_plan.py on a one-block tiny model.

The config matches tests/bench_test.py's (one block, square FFN, full rank,
2 sequences per replica on 8 devices), so in one session both roles' programs
are the bench's `normal` and `mecefo` programs and compile once.
"""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from configs import tiny
from mecefo_jax.config.resolve import resolve
from mecefo_jax.parallel import sharding
from studies import memory_plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OVERRIDES = ('--config.model.num_layers=1', '--config.model.ffn_hidden=32',
             '--config.mecefo.rank=1.0')
NUM_DEVICES = 8  # tiny's global batch 16 -> 2 sequences per replica


@pytest.fixture(scope='module')
def plan(tmp_path_factory):
    """scripts/memory_plan.py in a subprocess, as a user runs it (absl flags, config overrides)."""
    out = tmp_path_factory.mktemp('plan')
    path = os.pathsep.join(filter(None, [ROOT, os.environ.get('PYTHONPATH')]))
    # The session's compilation cache comes with os.environ (tests/conftest.py): programs
    # compiled here are reused.
    env = dict(os.environ, PYTHONPATH=path)
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, 'scripts', 'memory_plan.py'),
         '--config', os.path.join(ROOT, 'configs', 'tiny.py'), '--num_devices', str(NUM_DEVICES),
         '--out', str(out), *OVERRIDES], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / memory_plan.OUTPUT_FILE) as f:
        return json.load(f)


def _num_params() -> int:
    import flax

    from mecefo_jax.model.llama import build_model, init_params
    cfg = tiny.get_config()
    cfg.model.num_layers, cfg.model.ffn_hidden = 1, 32
    model = build_model(resolve(cfg))
    boxed = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(flax.linen.unbox(boxed)))


@pytest.mark.subprocess  # scripts/memory_plan.py
def test_plan_json_has_both_roles(plan):
    assert plan['mesh'] == {'data': 8, 'model': 1, 'per_replica_batch': 2, 'global_batch': 16}
    assert set(plan['roles']) == {'normal', 'neighbour'}
    assert plan['roles']['normal']['programs'] == ['normalx2']
    assert plan['roles']['neighbour']['programs'] == ['neighbourx4']
    for role in plan['roles'].values():
        assert role['peak_bytes'] > 0 and role['fits']
        assert role['peak_bytes'] == (role['argument_bytes'] + role['output_bytes']
                                      + role['temp_bytes'] - role['alias_bytes'])
    assert plan['platform'] == 'cpu'  # compiled for CPU devices: an estimate of the GPU bytes


@pytest.mark.subprocess  # scripts/memory_plan.py
def test_both_roles_hold_the_same_state(plan):
    normal, neighbour = plan['roles']['normal'], plan['roles']['neighbour']
    for key in ('parameters_bytes', 'optimizer_bytes', 'projections_bytes'):
        assert neighbour[key] == normal[key], key
    # mesh.model = 1: the device holds every float32 parameter, and Adam's
    # two moments of each (plus a few int32 step counters).
    assert normal['parameters_bytes'] == 4 * _num_params()
    assert normal['optimizer_bytes'] == pytest.approx(2 * normal['parameters_bytes'], abs=64)


@pytest.mark.subprocess  # scripts/memory_plan.py
def test_neighbour_computes_two_shards(plan):
    normal, neighbour = plan['roles']['normal'], plan['roles']['neighbour']
    # Two shards: 2 more rows of int32 tokens [seq_len + 1] and float32
    # weights per replica in the arguments (XLA may pad buffers a little).
    rows, seq = 2, 32 + 1
    extra_args = neighbour['argument_bytes'] - normal['argument_bytes']
    assert extra_args == pytest.approx(rows * (4 * seq + 4), abs=16)
    # And more activations: on this model (one block, d_model 32, vocab 256)
    # the loss's float32 [tokens, vocab] temporaries outweigh the block's
    # activations, and the neighbour computes the loss over twice the tokens.
    # (On LLaMA shapes the blocks dominate and the neighbour, which keeps no
    # attention activations, holds fewer: see configs/llama_1b.py.)
    assert neighbour['activations_bytes'] > normal['activations_bytes'] > 0


def test_device_bytes_follow_the_sharding():
    devices = jax.devices()[:2]
    mesh = sharding.mesh_from_rows([devices])  # 1 x 2: 'model' has two devices
    leaf = jax.ShapeDtypeStruct((4, 6), jnp.float32)
    split = NamedSharding(mesh, P(sharding.MODEL_AXIS, None))
    assert memory_plan.device_bytes([leaf], [split]) == 2 * 6 * 4
    assert memory_plan.device_bytes([leaf], [sharding.replicated(mesh)]) == 4 * 6 * 4


def test_plan_rejects_a_batch_the_replicas_cannot_split():
    cfg = tiny.get_config()
    cfg.data.global_batch_size = 12
    with pytest.raises(ValueError, match='data.global_batch_size=12'):
        memory_plan.resolve(resolve(cfg), 8)


def test_plan_names_the_device_flag_when_devices_are_missing():
    cfg = tiny.get_config()
    cfg.mesh.model = 16
    cfg.data.global_batch_size = 2
    with pytest.raises(ValueError, match='xla_force_host_platform_device_count=32'):
        memory_plan.plan(resolve(cfg), num_devices=32, log=lambda _: None)
