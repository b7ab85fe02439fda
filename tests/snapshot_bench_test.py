"""The one measurement of the snapshot path: every part timed beside a plain copy of its bytes.

`python -m studies.snapshot_bench` calls `path_figures` on a keeper actor; here it
runs on a 1 MiB tree into a keeper in this process (no Ray), and `with_ratios` on
figures given by hand.
"""
from mecefo_jax.snapshot import LocalKeeper
from studies import snapshot_bench

TIMED = ('write_cold', 'write', 'read_shm_cold', 'restore_shm_cold', 'read_shm', 'restore_shm',
         'async_write_per_step', 'checksum')


def test_every_part_of_the_path_is_timed_beside_a_copy_of_the_same_bytes():
    tree = snapshot_bench._tree(1, 2)
    with LocalKeeper('bench_test', slots=2) as keeper:
        out = snapshot_bench.with_ratios(snapshot_bench.path_figures(tree, keeper, repeats=1))
    assert out['bytes'] == 1 << 20 and out['copy_sec'] > 0
    for name in TIMED:
        assert out[f'{name}_sec'] > 0, name
        assert out[f'{name}_vs_copy'] == round(out['copy_sec'] / out[f'{name}_sec'], 3), name
    for mode in ('back_to_back', 'overlapped'):  # blocked times: no bandwidth, no ratio
        assert out[f'async_{mode}_blocked_per_step_sec'] >= 0
        assert f'async_{mode}_blocked_per_step_gbps' not in out
    assert 'copy_vs_copy' not in out


def test_ratios_are_the_copys_time_over_each_figures():
    out = snapshot_bench.with_ratios({'bytes': 2**30, 'copy_sec': 0.5, 'read_shm_sec': 2.0,
                                      'async_back_to_back_blocked_per_step_sec': 1.0})
    assert out['read_shm_gbps'] == 0.5 and out['read_shm_vs_copy'] == 0.25 and out['copy_gbps'] == 2.0
    assert 'async_back_to_back_blocked_per_step_vs_copy' not in out
    # The copy alone: its bandwidth is added, and no ratio.
    assert snapshot_bench.with_ratios({'bytes': 2**30, 'copy_sec': 0.5}) == {
        'bytes': 2**30, 'copy_sec': 0.5, 'copy_gbps': 2.0}
