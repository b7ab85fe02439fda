"""The node-loss jobs' shape, shared by tests/node_loss_test.py and tests/sharded_launch_test.py.

2 workers x 2 CPU devices of the tiny config (4 replicas: worker 1 holds replicas 2
and 3), on a simulated cluster of a node per worker and the head spare (workers go
to the head last); the programs come from the launcher tests' compilation cache.
"""
from configs.tiny import get_config
from mecefo_jax.config.resolve import resolve, updated

WORKERS, LOCAL = 2, 2
REPLICAS = WORKERS * LOCAL
STEPS = 12
CLUSTER_NODES = WORKERS + 1  # a node per worker, and the head spare


def config(launcher_caches, **extra):
    """The job's config: MeCeFO's adoption, snapshots every 2 steps, `extra` over it."""
    tokenizer, xla = launcher_caches
    values = {'train.steps': STEPS, 'train.eval_every': 0, 'mesh.data': REPLICAS,
              'fault.strategy': 'mecefo',  # the adoption these tests check
              'launch.local_devices': LOCAL, 'launch.compilation_cache': xla,
              'data.cache_dir': tokenizer, 'snapshot.every': 2, 'launch.compile_ahead': False}
    values.update(extra)
    return updated(resolve(get_config()), values)
