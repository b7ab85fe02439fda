"""A worker's progress report: completion read without blocking, and junk never trusted."""
import numpy as np
import pytest

from mecefo_jax.launch.chaos import FaultPoints
from mecefo_jax.launch.placement import Placement, assign_nodes, node_loss_problems
from mecefo_jax.launch.worker import Progress, Worker


class Output:
    """A step output that becomes ready, or fails, when told (a jax.Array's is_ready)."""

    def __init__(self):
        self.ready = self.failed = False

    def is_ready(self):
        return self.ready

    def block_until_ready(self):
        if self.failed:
            raise RuntimeError('Gloo AllGather failed: Connection closed by peer')
        return self


def test_completed_counts_the_outputs_that_are_ready_in_order():
    progress, outputs = Progress(), [Output() for _ in range(3)]
    for step, output in enumerate(outputs):
        progress.dispatched_step(step + 1, output)
    assert progress.report() == {'dispatched': 3, 'completed': 0}
    outputs[1].ready = True  # steps complete in order: the first is still running
    assert progress.report()['completed'] == 0
    outputs[0].ready = True
    assert progress.report()['completed'] == 2
    # A step whose collective a dead peer broke is ready, with an error: not completed.
    outputs[2].ready = outputs[2].failed = True
    assert progress.report()['completed'] == 2


@pytest.mark.parametrize('junk', [
    None, 'text', [1, 2], {}, {'dispatched': 1}, {'dispatched': '1', 'completed': 0},
    {'dispatched': 1, 'completed': True}, {'dispatched': 1, 'completed': -1},
    {'dispatched': 1, 'completed': 1.5}, {'dispatched': 1, 'completed': 0, 'held': 'x'},
    {'dispatched': 1, 'completed': 0, 'held': {'kind': 'other', 'step': 3}},
    {'dispatched': 1, 'completed': 0, 'held': {'kind': 'publish', 'step': '3'}},
])
def test_a_report_that_is_not_one_is_refused(junk):
    assert Progress.parse(junk) is None


def test_a_report_keeps_only_its_fields():
    report = {'dispatched': 4, 'completed': 3, 'held': None, 'extra': np.zeros(10)}
    assert Progress.parse(report) == {'dispatched': 4, 'completed': 3, 'held': None}


def test_a_workers_report_says_where_its_fault_points_hold_it():
    """The actor's report is its progress and, while an injected failure holds it, where
    (`FaultPoints.held`, set by the hold): what the launcher's injector waits for."""
    worker = Worker.__new__(Worker)  # its methods alone: no Ray, no warm-up thread
    worker.progress_, worker.points = Progress(), None
    assert Progress.parse(worker.progress()) == {'dispatched': 0, 'completed': 0, 'held': None}
    worker.points = FaultPoints(after_snapshot_step=6)
    worker.points.held = {'kind': 'snapshot', 'step': 6}  # what `hold` sets before it waits
    assert Progress.parse(worker.progress())['held'] == {'kind': 'snapshot', 'step': 6}


def test_workers_spread_over_nodes_and_stay_where_their_keepers_are():
    assert assign_nodes(range(4), ['a', 'b', 'c']) == {0: 'a', 1: 'b', 2: 'c', 3: 'a'}
    # Worker 1's node was lost: the others keep theirs, worker 1 takes the least loaded.
    assert assign_nodes(range(4), ['a', 'c', 'd'], keep={0: 'a', 2: 'c', 3: 'a', 1: 'b'}) == {
        0: 'a', 2: 'c', 3: 'a', 1: 'd'}


def test_a_node_loss_is_survivable_with_a_whole_replica_elsewhere_or_parity():
    dp = Placement(4, 2, 1)  # each worker holds two whole replicas
    assert node_loss_problems(dp, {0: 'a', 1: 'a', 2: 'b', 3: 'b'}) == []
    assert node_loss_problems(dp, {w: 'a' for w in range(4)}) != []  # one node, every copy
    tp = Placement(4, 1, 4)  # one replica spread over the 4 workers
    spread = {0: 'a', 1: 'b', 2: 'c', 3: 'd'}
    assert node_loss_problems(tp, spread) != []  # no copy and no parity
    assert node_loss_problems(tp, spread, parity_group=4) == []  # one member per node
    two_per_node = {0: 'a', 1: 'a', 2: 'b', 3: 'b'}
    assert 'parity group' in node_loss_problems(tp, two_per_node, parity_group=4)[0]
    # Groups of 2 (workers 0-1, 2-3) with one member of each on each node.
    assert node_loss_problems(tp, {0: 'a', 1: 'b', 2: 'a', 3: 'b'}, parity_group=2) == []
