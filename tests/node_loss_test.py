"""A whole node lost (its worker, keeper and shared memory together), survived from memory.

One simulated Ray cluster of 5 nodes for the module, 4 workers x 1 CPU device
(the tiny config, 4 replicas), one worker per node and the head node spare
(workers go to the head last). The node of worker 1 is removed abruptly
right after a snapshot every keeper holds; the survivors go on from their
own keepers under MeCeFO, and worker 1 rejoins on the spare node, healing
its state from its peers. Placement refusals need no job at all.
"""
import json
import os

import pytest
from simulated_params import assert_params_equal_simulated

from configs.tiny import get_config
from mecefo_jax.config_resolve import resolve, updated
from mecefo_jax.launch.supervisor import Launcher

pytestmark = [pytest.mark.subprocess, pytest.mark.ray]  # Ray's processes and workers

WORKERS = 4
STEPS = 12
RETURN = 2


CLUSTER_NODES = WORKERS + 1  # a node per worker, and the head spare


@pytest.fixture(scope='module')
def cluster(private_ray_cluster):
    return private_ray_cluster  # its own: a node of it is lost (tests/conftest.py)


def config(tmp, tokenizer_cache, **extra):
    values = {'train.steps': STEPS, 'train.eval_every': 0, 'mesh.data': WORKERS,
              'fault.strategy': 'mecefo',  # the adoption these tests check
              'data.global_batch_size': 8, 'launch.local_devices': 1,
              'launch.compilation_cache': str(tmp / 'xla'), 'data.cache_dir': tokenizer_cache,
              'snapshot.every': 2, 'launch.compile_ahead': False}
    values.update(extra)
    return updated(resolve(get_config()), values)


@pytest.fixture(scope='module')
def lost(cluster, tmp_path_factory, tokenizer_cache):
    tmp = tmp_path_factory.mktemp('node_loss')
    workdir = str(tmp / 'job')
    cfg = config(tmp, tokenizer_cache, **{'launch.kill': '4:1:node:snapshot',
                                          'launch.return_after_steps': RETURN})
    summary = Launcher(cfg, workdir, WORKERS, log=lambda _: None, node_killer=cluster.lose).run()
    return summary, workdir, tmp


def test_a_lost_node_is_detected_within_seconds_and_survived_with_nothing_redone(cluster, lost):
    summary, workdir, _ = lost
    failure, rejoin = summary['recoveries']
    assert failure['cause'] == 'its node died' and failure['failed_workers'] == [1]
    assert failure['lost_nodes'] == summary['lost_nodes'] and len(summary['lost_nodes']) == 1
    assert failure['detect_sec'] < 5.0  # the project's target; the test cluster's health check
    assert failure['members'] == [0, 2, 3] and failure['resume'] == 'memory'
    assert failure['resume_step'] == failure['completed_steps'] == 4
    assert failure['redone_steps'] == 0 and failure['healed_bytes'] == 0
    # Back at full size on the spare node (the live one hosting no worker), with a new
    # keeper: its state came from its peers.
    assert rejoin['kind'] == 'rejoin' and rejoin['members'] == [0, 1, 2, 3]
    assert rejoin['nodes']['1'] == cluster.head not in failure['nodes'].values()
    assert rejoin['healed_bytes'] > 0 and rejoin['redone_steps'] == 0
    ends = [json.load(open(os.path.join(workdir, 'launch', f'g2_w{w}_end.json')))
            for w in range(WORKERS)]
    assert all(e['finished'] for e in ends)
    assert len({e['params_sha256'] for e in ends}) == 1


def test_every_step_of_a_node_loss_is_computed_exactly_once(lost):
    _, workdir, _ = lost
    rows = [json.loads(line) for line in open(os.path.join(workdir, 'launch', 'provenance.jsonl'))]
    final = {row['step']: row for row in rows}  # a later generation's record supersedes
    assert sorted(final) == list(range(STEPS))
    for step, row in final.items():
        assert row['covered'] == {str(s): 2 for s in range(WORKERS)}, step
        assert row['replicas'] == ([0, 2, 3] if 4 <= step < 4 + RETURN else [0, 1, 2, 3]), step


def test_final_parameters_equal_the_same_failure_simulated_in_one_process(lost, tokenizer_cache):
    _, workdir, tmp = lost
    cfg = updated(config(tmp, tokenizer_cache), {'fault.events': f'4:1:{RETURN}'})
    assert_params_equal_simulated(workdir, cfg, tmp / 'simulated', replicas=WORKERS)


def test_a_placement_that_one_lost_node_would_end_is_refused(cluster, tmp_path, tokenizer_cache):
    """mesh.data=1 with the model over the 4 workers: no worker holds a whole replica, so
    losing any node loses part of the state, unless XOR parity (one member of each group
    per node) can rebuild it."""
    values = {'mesh.data': 1, 'mesh.model': WORKERS}
    with pytest.raises(ValueError, match='accept_node_loss'):
        Launcher(config(tmp_path, tokenizer_cache, **values), str(tmp_path / 'a'), WORKERS,
                 log=lambda _: None)._first_generation(0.0)
    launcher = Launcher(config(tmp_path, tokenizer_cache, **values, **{'snapshot.parity': 'xor'}),
                        str(tmp_path / 'b'), WORKERS, log=lambda _: None)
    try:
        launcher._first_generation(0.0)  # parity groups spread over the nodes: accepted
        assert len(set(launcher.job.nodes.values())) == WORKERS
    finally:
        launcher.job.keepers.stop_all()
