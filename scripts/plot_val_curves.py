"""Validation curves of stored time-to-target runs, side by side, a panel per seed.

    python scripts/plot_val_curves.py --dir DIR --seeds 2,3 \
        --runs fault_free,mecefo_high,mecefo_high_rank64 --out curves.png

DIR is a `scripts/time_to_target.py --out` (or a `scripts/verdict.py` point's)
directory: DIR/seed<s>/<run>.json. Each panel draws the runs' validation loss
minus the fault-free run's at the same step (where both evaluated; past the
fault-free run's last step, minus its final loss: the target a run must
reach), the dashed line at 0 being the fault-free curve, so where two runs
part, and when each crosses the target, is read off directly. Prints the
same figures as a table, and writes them as JSON next to the PNG.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from absl import app, flags  # noqa: E402

_DIR = flags.DEFINE_string('dir', None, 'Where the runs are kept (DIR/seed<s>/<run>.json).',
                           required=True)
_SEEDS = flags.DEFINE_list('seeds', ['0'], 'Seeds, a panel each.')
_RUNS = flags.DEFINE_list('runs', None, 'Run names (their record files without .json).',
                          required=True)
_OUT = flags.DEFINE_string('out', 'val_curves.png', 'The PNG; its JSON goes beside it.')


def _load(seed: str, run: str) -> dict:
    path = os.path.join(_DIR.value, f'seed{seed}', f'{run}.json')
    if not os.path.exists(path):
        sys.exit(f'--runs: no record {path}; the runs stored there: '
                 + ', '.join(sorted(n[:-5] for n in os.listdir(os.path.dirname(path))
                                    if n.endswith('.json'))))
    with open(path) as f:
        return json.load(f)


def gaps(seed: str) -> dict:
    """{run: [[step, val loss - fault-free val loss]]} (module docstring)."""
    free = dict((int(s), v) for s, v in _load(seed, 'fault_free')['val_curve'])
    last = max(free)
    out = {}
    for run in _RUNS.value:
        curve = _load(seed, run)['val_curve']
        out[run] = [[int(s), v - free[min(int(s), last)]] for s, v in curve
                    if int(s) in free or int(s) > last]
    return out


def main(argv):
    del argv
    from studies.report import pyplot, write_json
    figures = {seed: gaps(seed) for seed in _SEEDS.value}
    for seed, runs in figures.items():
        print(f"seed {seed}: validation loss minus the fault-free run's")
        for run, points in runs.items():
            print(f'  {run:40s} ' + ' '.join(f'{s}:{g:+.4f}' for s, g in points))
    plt = pyplot()
    fig, axes = plt.subplots(1, len(figures), figsize=(5.5 * len(figures), 4), squeeze=False,
                             sharey=True)
    for ax, (seed, runs) in zip(axes[0], figures.items()):
        for run, points in runs.items():
            ax.plot([s for s, _ in points], [g for _, g in points], marker='.', label=run)
        ax.axhline(0.0, color='grey', ls='--', lw=0.8)
        ax.set_title(f'seed {seed}')
        ax.set_xlabel('step')
    axes[0][0].set_ylabel('val loss - fault-free val loss')
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(_OUT.value, dpi=110)
    write_json(os.path.splitext(_OUT.value)[0] + '.json', figures)
    print(f'wrote {_OUT.value}')


if __name__ == '__main__':
    app.run(main)
