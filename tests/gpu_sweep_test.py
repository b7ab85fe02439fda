"""studies/gpu/sweep.py's greedy search, on a made-up machine (no jax, no GPU).

The made-up step: tokens a second grow with the batch up to 32k tokens a
device; 64k tokens fit only with full remat (and are then fastest); 1,024
tokens a sequence, XLA's attention and save_dots are slower; unrolled layers
are faster by less than MIN_GAIN (noise: not kept); a flat optimizer is 5 %
faster.
"""
import time

from studies.gpu import sweep

SPEED = {4096: 1.0, 16384: 1.6, 32768: 1.8, 65536: 1.9}


class FakeCells:
    model = 'llama_350m'

    def __init__(self):
        self.prepared = []

    def prepare(self, cells, start_by):
        self.prepared.append(len(cells))

    def measure(self, s, stage):
        cell = dict(s, model=self.model, stage=stage, fits=True, overrides={
            'data.seq_len': s['seq_len'], 'model.remat_policy': s['remat_policy']})
        if s['tokens_per_device'] == 65536 and s['remat_policy'] != 'full':
            return dict(cell, fits=False)
        speed = SPEED[s['tokens_per_device']] * (0.8 if s['seq_len'] == 1024 else 1.0)
        speed *= {'cudnn': 1.0, 'xla': 0.7}[s['attention']]
        speed *= {'none': 1.0, 'save_dots': 0.9, 'full': 0.97}[s['remat_policy']]
        speed *= (1.005 if not s['scan_layers'] else 1.0) * (1.05 if s['flat_optimizer'] else 1.0)
        return dict(cell, tokens_per_sec=1e5 * speed, step_ms=1.0)


BASELINE = {'tokens_per_device': 4096, 'seq_len': 256, 'attention': 'cudnn',
            'remat_policy': 'none', 'scan_layers': True, 'flat_optimizer': False, 'xla_flags': ''}


def test_the_greedy_search_keeps_only_what_is_faster_and_fits():
    cells = sweep.greedy(FakeCells(), BASELINE, sweep.FULL, time.monotonic() + 60, print)
    kept = [(c['stage'], c['tokens_per_device'], c['remat_policy'], c['flat_optimizer'])
            for c in cells if c['accepted']]
    assert kept == [('baseline', 4096, 'none', False), ('batch', 16384, 'none', False),
                    ('batch', 32768, 'none', False),
                    ('remat', 65536, 'full', False),  # 64k did not fit; full remat lets it
                    ('optimizer', 65536, 'full', True)]
    tried = [(c['stage'], c['tokens_per_device'], c['seq_len'], c['remat_policy']) for c in cells]
    assert ('batch', 65536, 256, 'none') in tried and not cells[3]['fits']  # the climb's end
    assert ('sequence', 32768, 1024, 'none') in tried
    assert [c['stage'] for c in cells].count('scan') == 1  # tried, 0.5 % faster: not kept
    endpoint = sweep.endpoint(cells, 'llama_350m')
    assert endpoint['flat_optimizer'] and endpoint['tokens_per_device'] == 65536
    out = sweep.summary(cells, sweep.FULL)
    assert out['best']['llama_350m'] == endpoint
    assert out['best_by_batch']['llama_350m']['4096x256']['stage'] == 'baseline'
    assert out['gpu_defaults']['llama_350m']['config'] == {'model.remat_policy': 'full'}


def test_the_search_stops_at_its_deadline_with_what_it_has():
    cells = sweep.greedy(FakeCells(), BASELINE, sweep.FULL, time.monotonic() - 1, print)
    assert [c['stage'] for c in cells] == ['baseline']


def test_a_change_must_be_faster_by_the_minimum_gain_and_fit():
    best = {'tokens_per_sec': 100.0, 'fits': True}
    assert sweep.better({'tokens_per_sec': 102.0, 'fits': True}, best)
    assert not sweep.better({'tokens_per_sec': 100.5, 'fits': True}, best)
    assert not sweep.better({'tokens_per_sec': 200.0, 'fits': False}, best)
    assert not sweep.better({'error': 'cuDNN is not detected', 'fits': True}, best)
