"""A whole node lost (its worker, keeper and shared memory together), survived from memory.

One simulated Ray cluster of 3 nodes for the module, 2 workers x 2 CPU
devices (the tiny config, 4 replicas: worker 1 holds replicas 2 and 3), one
worker per node and the head node spare (workers go to the head last). The
node of worker 1 is removed abruptly right after a snapshot every keeper
holds; the survivor goes on from its own keeper under MeCeFO, and worker 1
rejoins on the spare node, healing its state from its peer. The job is
tests/launch_jobs.py's, so its programs come from the launcher tests' compilation cache.
Placement refusals need no job at all.
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

RETURN = 2


@pytest.fixture(scope='module')
def cluster(private_ray_cluster):
    return private_ray_cluster  # its own: a node of it is lost (tests/conftest.py)


def config(launcher_caches, **extra):
    # The whole-state snapshot: the survivor restores from its own keeper alone. The
    # sharded default's node loss is tests/sharded_launch_test.py's.
    return job_config(launcher_caches, **{'snapshot.shard': False, **extra})


@pytest.fixture(scope='module')
def lost(cluster, tmp_path_factory, launcher_caches):
    tmp = tmp_path_factory.mktemp('node_loss')
    workdir = str(tmp / 'job')
    cfg = config(launcher_caches, **{'launch.kill': '4:1:node:snapshot',
                                          'launch.return_after_steps': RETURN})
    summary = Launcher(cfg, workdir, WORKERS, log=lambda _: None, node_killer=cluster.lose).run()
    return summary, workdir, tmp


def test_a_lost_node_is_detected_within_seconds_and_survived_with_nothing_redone(cluster, lost):
    summary, workdir, _ = lost
    failure, rejoin = summary['recoveries']
    assert failure['cause'] == 'its node died' and failure['failed_workers'] == [1]
    assert failure['lost_nodes'] == summary['lost_nodes'] and len(summary['lost_nodes']) == 1
    assert failure['detect_sec'] < 5.0  # the project's target; the test cluster's health check
    assert failure['members'] == [0] and failure['resume'] == 'memory'
    assert failure['resume_step'] == failure['completed_steps'] == 4
    assert failure['redone_steps'] == 0 and failure['healed_bytes'] == 0
    # Back at full size on the spare node (the live one hosting no worker), with a new
    # keeper: its state came from its peer.
    assert rejoin['kind'] == 'rejoin' and rejoin['members'] == [0, 1]
    assert rejoin['nodes']['1'] == cluster.head not in failure['nodes'].values()
    assert rejoin['healed_bytes'] > 0 and rejoin['redone_steps'] == 0
    ends = [json.load(open(os.path.join(workdir, 'launch', f'g2_w{w}_end.json')))
            for w in range(WORKERS)]
    assert all(e['finished'] for e in ends)
    assert len({e['params_sha256'] for e in ends}) == 1


def test_every_step_of_a_node_loss_is_computed_exactly_once(lost, launcher_caches):
    _, workdir, _ = lost
    shard = int(config(launcher_caches).data.global_batch_size) // REPLICAS
    rows = [json.loads(line) for line in open(os.path.join(workdir, 'launch', 'provenance.jsonl'))]
    final = {row['step']: row for row in rows}  # a later generation's record supersedes
    assert sorted(final) == list(range(STEPS))
    for step, row in final.items():
        assert row['covered'] == {str(s): shard for s in range(REPLICAS)}, step
        # Worker 1's replicas (2 and 3) were down for RETURN steps, their shards adopted.
        assert row['replicas'] == ([0, 1] if 4 <= step < 4 + RETURN else [0, 1, 2, 3]), step


def test_final_parameters_equal_the_same_failure_simulated_in_one_process(lost, launcher_caches):
    _, workdir, tmp = lost
    cfg = updated(config(launcher_caches), {'fault.events': f'4:2:{RETURN},4:3:{RETURN}'})
    assert_params_equal_simulated(workdir, cfg, tmp / 'simulated', replicas=REPLICAS)


def test_a_placement_that_one_lost_node_would_end_is_refused(cluster, tmp_path, launcher_caches):
    """mesh.data=1 with the model over both workers: no worker holds a whole replica, so
    losing either node loses part of the state, unless XOR parity (one member of each
    group per node) can rebuild it."""
    values = {'mesh.data': 1, 'mesh.model': REPLICAS, 'snapshot.parity': ''}
    with pytest.raises(ValueError, match='accept_node_loss'):
        Launcher(config(launcher_caches, **values), str(tmp_path / 'a'), WORKERS,
                 log=lambda _: None)._first_generation(0.0)
    launcher = Launcher(config(launcher_caches, **dict(values, **{'snapshot.parity': 'xor'})),
                        str(tmp_path / 'b'), WORKERS, log=lambda _: None)
    os.makedirs(launcher.dir)  # as Launcher.run makes it: the job's records go there
    try:
        launcher._first_generation(0.0)  # parity groups spread over the nodes: accepted
        assert len(set(launcher.job.nodes.values())) == WORKERS
    finally:
        launcher.job.keepers.stop_all()
