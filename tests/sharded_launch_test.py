"""The sharded snapshot under the launcher: a lost keeper and a lost node, restored from memory.

`snapshot.shard=True` with XOR parity in groups of 2 (`snapshot.parity=xor`): each
of the 2 workers writes half of the replicated state, plus its parity share; a
restore reads both halves. One simulated Ray cluster of 3 nodes for the module
(a node is lost in it), 2 workers x 2 CPU devices of the tiny config. The node of
worker 1 is lost right after a snapshot every keeper holds: worker 1's half is
rebuilt from parity on a live node, worker 0 goes on from both halves, and the
final parameters equal the same failures simulated in one process. Then, on the
two nodes left, worker 1's keeper alone is killed: its worker meets the loss at its
next snapshot, and the half it last wrote comes back from parity the same way.
"""
import json
import os

import pytest
from node_jobs import CLUSTER_NODES, REPLICAS, STEPS, WORKERS  # noqa: F401 (the cluster's size)
from node_jobs import config as job_config
from simulated_params import assert_params_equal_simulated

from mecefo_jax.config.resolve import updated
from mecefo_jax.launch.launcher import Launcher

pytestmark = [pytest.mark.subprocess, pytest.mark.ray]  # Ray's processes and workers


@pytest.fixture(scope='module')
def cluster(private_ray_cluster):
    return private_ray_cluster  # its own: a node of it is lost (tests/conftest.py)


def config(launcher_caches, **extra):
    return job_config(launcher_caches, **{'snapshot.shard': True, 'snapshot.parity': 'xor',
                                          'snapshot.parity_group': 2, **extra})


RETURN = 2  # after the node loss worker 1 rejoins: the last generation has both workers


def _run(cluster, launcher_caches, tmp, kill, **extra):
    workdir = str(tmp / 'job')
    summary = Launcher(config(launcher_caches, **{'launch.kill': kill}, **extra), workdir, WORKERS,
                       log=lambda _: None, node_killer=cluster.lose).run()
    return summary, workdir


@pytest.fixture(scope='module')
def node_lost(cluster, tmp_path_factory, launcher_caches):
    return _run(cluster, launcher_caches, tmp_path_factory.mktemp('shard_node'),
                '4:1:node:snapshot', **{'launch.return_after_steps': RETURN})


@pytest.fixture(scope='module')
def keeper_lost(node_lost, cluster, tmp_path_factory, launcher_caches):
    # After the node loss: the head and worker 0's node are left.
    return _run(cluster, launcher_caches, tmp_path_factory.mktemp('shard_keeper'), '3:1:keeper')


def _ends(workdir):
    return [json.load(open(os.path.join(workdir, 'launch', name)))
            for name in sorted(os.listdir(os.path.join(workdir, 'launch')))
            if name.endswith('_end.json')]


@pytest.mark.parametrize('job', ['node_lost', 'keeper_lost'])
def test_a_lost_half_comes_back_from_parity(job, request):
    summary, _ = request.getfixturevalue(job)
    failure = summary['recoveries'][0]
    assert failure['failed_workers'] == [1] and failure['resume'] == 'memory'
    assert failure['parity_rebuilt_workers'] == [1] and failure['shard_writers'] == [0, 1]
    assert failure['healed_bytes'] > 0
    if job == 'node_lost':  # it lands right after a snapshot every keeper holds
        assert failure['resume_step'] == failure['completed_steps'] == 4
        assert failure['redone_steps'] == 0
    else:
        assert failure['deaths'] == {'1': 'its keeper died'}


@pytest.mark.parametrize('job', ['node_lost', 'keeper_lost'])
def test_final_parameters_equal_the_same_failure_simulated_in_one_process(job, request, tmp_path,
                                                                          launcher_caches):
    summary, workdir = request.getfixturevalue(job)
    down = summary['recoveries'][0]['resume_step']  # replicas 2 and 3 are down from there on
    steps = RETURN if job == 'node_lost' else STEPS - down
    cfg = updated(config(launcher_caches), {'fault.events': f'{down}:2:{steps},{down}:3:{steps}'})
    assert_params_equal_simulated(workdir, cfg, tmp_path / 'simulated', replicas=REPLICAS)


def test_each_worker_wrote_half_the_state_plus_its_parity_share(node_lost):
    _, workdir = node_lost
    last = max(e['generation'] for e in _ends(workdir))
    ends = [e for e in _ends(workdir) if e['generation'] == last]  # both back, sharded over 2
    assert sorted(e['worker'] for e in ends) == [0, 1]
    for end in ends:
        per_snapshot = end['snapshot_bytes'] / end['snapshots_published']
        # Half the state, and a header (the entries' JSON) beside it.
        assert 0.45 * end['state_bytes'] < per_snapshot < 0.6 * end['state_bytes'], end
        assert end['snapshot_parity_bytes'] > 0, end
