"""The verdict's prose from its report: every figure README.md's verdict section, its goodput row and docs/verdict.md
quote, built from `docs/results/verdict.json` (which `tests/verdict_test.py` rebuilds from the records), so that
`tests/verdict_claims_test.py` can hold the docs to the records and fail where one drifts."""
from __future__ import annotations

from studies import verdict_points as vp
from studies import verdict_report as vr
from studies.intervals import cell
from studies.report import fmt, markdown_table
from studies.runs import run_name

DROP, MECEFO, CONTROL = vp.DEFAULT, vp.MECEFO_RUN, vp.CONTROL_RUN
MODEL_POINTS = ('small', 'paper_like')  # the ends docs/verdict.md's rate model is read at


def _capped(name: str) -> str:
    return run_name(*vp.capped_plan(vp.POINTS[name]))


def _g(p: dict, run: str, cost: str, bold: bool = False) -> str:
    """A run's mean goodput and its interval."""
    g = p['runs'][run]['goodput'][cost]
    mean = f"**{g['mean']:.3f}**" if bold else f"{g['mean']:.3f}"
    return f"{mean} [{g['lo']:.3f}, {g['hi']:.3f}]"


def _signed(x: float) -> str:
    """+0.012; a move that rounds to nothing as +0.000, not -0.000."""
    return f'{round(x, 3) + 0.0:+.3f}'


def _join(items: list[str]) -> str:
    return ', '.join(items[:-1]) + (' and ' if len(items) > 1 else '') + items[-1] if items else 'none'


def _behind_everywhere(p: dict) -> list[str]:
    """The runs `drop` is ahead of by an interval that excludes 0 under every cost that prices them."""
    runs = [r for r in p['runs'] if r not in ('fault_free', DROP)]
    return [f'`{r}`' for r in runs if all(c['paired'][r]['side'] == '+' for c in p['costs'].values()
                                          if r in c['paired'])]


def mecefo_ahead(report: dict) -> list[tuple[str, str, str]]:
    """(point, cost, run) wherever the paper's rule or the capped plan, the MeCeFO settings every point ran, is ahead
    of `drop` by an interval that excludes 0."""
    return [(name, label, run) for name, p in report['points'].items() for label, c in p['costs'].items()
            for run in (MECEFO, _capped(name)) if c['paired'].get(run, {}).get('side') == '−']


def readme_summary(report: dict) -> str:
    """README.md's paragraph under its map."""
    maps = {name: p['costs'][vr.GPU]['map']['drop_minus']['mecefo'] for name, p in report['points'].items()}
    ahead = [f'`{n}`' for n, d in maps.items() if d['side'] == '+']
    tied = {n: d for n, d in maps.items() if d['side'] == '='}
    need = sorted(d['seeds_needed'] for d in tied.values())
    seeds = sorted({len(report['points'][n]['seeds']) for n in tied})
    name = report['default_point']
    best = report['points'][name]['costs'][vr.GPU]['map']['best']
    strategy = {run_name(*r): r for r in vp.runs_of(vp.POINTS[name])}[best].strategy
    fragile = [f'`{n}`' for n, d in maps.items() if d['side'] == '+' and d['side_with_bound'] != '+']
    if fragile:  # where the records' clock could take the interval across 0
        ahead[-1] += f"; at {_join(fragile)} the records' clock could move it across 0"
    return (f"Where an interval excludes 0 `drop` is ahead ({_join(ahead)}); at {_join([f'`{n}`' for n in tied])} "
            f"{_join([str(s) for s in seeds])} seeds do not separate it from `mecefo` ({need[0]} to {need[-1]} "
            f"would). Of the two MeCeFO settings every point ran, the paper's rule and the capped plan, "
            + ('neither is significantly ahead of `drop` at any point under any step cost' if not mecefo_ahead(report)
               else 'one is significantly ahead of `drop` somewhere (the report says where)')
            + "; the ablations and the other rules ran at `small`, seed 0, only. Every point's records meet failures "
              f'on the wall clock with a data order per seed. `{strategy}` stays the default: the best under '
              f'{vr.COSTS[vr.GPU][0]} costs at `{name}`, the largest shape with {vr.MIN_DEFAULT_SEEDS}+ seeds.')


def goodput_row(report: dict) -> str:
    """README.md's "What was measured" row for goodput under failures: the default point's figures."""
    name = report['default_point']
    p = report['points'][name]
    clock, bench = p['costs']['flops_allreduce'], p['costs']['h200_allreduce']
    serial = 'one failure at a time' if p['overrides'].get('fault.max_concurrent') == 1 else 'concurrent failures'
    setting = (f"`configs/small.py`'s model, {p['replicas']} replicas, {serial}, {p['steps']:,} steps, "
               f"{len(p['seeds'])} seeds, failures on the wall clock (the verdict's `{name}` point)")
    result = (f"`drop` {_g(p, DROP, vr.GPU, bold=True)}; MeCeFO (`mecefo`, the paper's rule) "
              f"{_g(p, MECEFO, 'flops_allreduce')} by the FLOP cost model with the 1M model's all-reduce "
              f"(φ {clock['phi']:.3f}, the clock the runs met failures on), {_g(p, MECEFO, vr.GPU)} on step costs "
              f"measured on an H200 at 350M, {_g(p, MECEFO, 'h200_allreduce')} with 350M's all-reduce "
              f"(φ {bench['phi']:.3f})")
    return f'| goodput under failures | {setting} | {result} | [verdict.md](docs/verdict.md) |'


def model_table(report: dict) -> str:
    """docs/verdict.md's rate model at MODEL_POINTS: under each step cost the neighbour's step c (the column's own,
    diluted by its phi), v* of one neighbour and of the best split, beside v measured and the break-even step c*."""
    rows = []
    for name in MODEL_POINTS:
        p = report['points'][name]
        for c in p['costs'].values():
            m, split = c['model'], c['model']['best_split']
            v = p['v'] if CONTROL in p['runs'] else None
            rows.append([f'`{name}`', c['name'], p['replicas'], f"{m['one_failure_steps']['mecefo']:.3f}",
                         f"{m['break_even_v']:.2f}", split['helpers'], f"{split['neighbour_step']:.2f}",
                         f"{split['break_even_v']:.2f}", cell(v, '.2f') + f" ({v['seeds']} seeds)" if v else 'n/a',
                         fmt(p['break_even_step'], '.3f')])
    return markdown_table(['', 'step cost', 'n', 'c (one failure)', 'v*', 'k', 'c_k', 'v*_k', 'v measured [95%]',
                           'break-even step c*'], rows)


def model_paragraph(report: dict) -> str:
    """Where v's interval at each of MODEL_POINTS falls against the break-even v of one neighbour and of the split."""
    parts = []
    for name in MODEL_POINTS:
        p = report['points'][name]
        one = [c['model']['break_even_v'] for c in p['costs'].values()]
        split = [c['model']['best_split']['break_even_v'] for c in p['costs'].values()]
        v = p['v']
        lines = (f'v* of one neighbour {min(one):.2f} to {max(one):.2f} over the step costs, '
                 f'v*_k of the best split {min(split):.2f} to {max(split):.2f}')
        mean = (f"v is {v['mean']:.2f} by its mean, " + ('below' if v['mean'] < min(one + split) else 'not below')
                + ' every line')
        if v['hi'] is None:
            parts.append(f"at `{name}` ({lines}) {mean}, and its interval unbounded at {v['seeds']} seeds")
            continue
        one_out, split_out = v['hi'] < min(one), v['hi'] < min(split)
        parts.append(f"at `{name}` ({lines}) {mean}, and its interval reaches {v['hi']:.2f}: {v['seeds']} seeds "
                     + ('rule out' if one_out else 'do not rule out') + ' that one neighbour keeps up with `drop`'
                     + (', and ' if one_out == split_out else ', but ')
                     + ('rule out' if split_out else 'not') + ' that the split does')
    return 'By the rate model, ' + '; '.join(parts) + '.'


def phi_paragraph(report: dict) -> str:
    """What phi the clock ran at and what phi the H200 columns take, per replica count, with the other assumptions'."""
    by_replicas = {}
    for p in report['points'].values():
        by_replicas.setdefault(p['replicas'], p['allreduce'])
    parts = []
    for n, a in sorted(by_replicas.items()):
        clock, bench = a['clock']['sensitivity'], a['bench']['sensitivity']
        others = '; '.join(f'{k}: {clock[k]:.3f} and {bench[k]:.3f}' for k in clock if k != 'as stated')
        parts.append(f"at {n} replicas the 1M step's φ is {a['clock']['ran_at']:.3f}, the 350M step's "
                     f"{a['bench']['phi']:.3f} ({others}; 350M with the H200's measured step as its compute: "
                     f"{bench[next(k for k in bench if 'bench' in k)]:.3f})")
    return 'As stated, ' + '; '.join(parts) + '.'


def replay_paragraph(report: dict) -> str:
    """What replaying elastic and checkpoint_restart with their pauses on the clock (and at each column's ratios)
    moved."""
    names = list(report['points'])
    moves = {(n, label): c['replay_moves'] for n in names for label, c in report['points'][n]['costs'].items()}
    restart = {n: moves[n, 'flops_allreduce']['checkpoint_restart_high'] for n in names}
    every = [m for per in moves.values() for m in per.values()]
    return (f"With the pauses on the clock alone (the FLOPs + all-reduce column, whose ratios are the clock's), "
            f"`checkpoint_restart` moves by {_join([f'{_signed(restart[n])} at `{n}`' for n in names])}; `elastic`, "
            f"whose changes cost a rebuild rather than a relaunch, by at most "
            f"{max(abs(moves[n, 'flops_allreduce']['elastic_high']) for n in names):.4f}. At the H200's ratios as "
            f"well, every replayed figure moves by {_signed(min(every))} to {_signed(max(every))}.")


def bound_paragraph(report: dict) -> str:
    """Where the trained runs' clock bound exceeds a paired difference's half-width, or takes its interval across
    0."""
    wide, crossing = [], []
    for name, p in report['points'].items():
        for c in p['costs'].values():
            for run, d in c['paired'].items():
                where = f"`{run}` at `{name}` under {c['name']} (±{d['clock_bound']:.3f})"
                if d['clock_bound'] > d['hi'] - d['mean']:
                    wide.append(where)
                if d['side_with_bound'] != d['side']:
                    crossing.append(where)
    kept = all(w not in crossing for w in wide)
    return (f"The bound exceeds the interval's half-width for {_join(wide)}"
            + (', each of which keeps its side of 0 with the bound added' if wide and kept else '')
            + f'; it could take an interval across 0 for {_join(crossing)}.')


def attribution_paragraph(report: dict, name: str = 'paper_like') -> str:
    """What moved the FLOP-model figures of `name` from its step-clock records to its wall-clock ones."""
    a = report['points'][name]['attribution']
    drop, ours = a[DROP], a[MECEFO]
    phi = report['points'][name]['costs']['flops_allreduce']['clock_phi']

    def gap(key: str) -> str:
        return _signed(drop[key] - ours[key])
    return (f"Priced with the all-reduce (φ {phi:.3f}), the same step-clock records give `mecefo` "
            f"{ours['step_clock_diluted']:.3f} instead of {ours['step_clock']:.3f}, and `drop` − `mecefo` falls from "
            f"{gap('step_clock')} to {gap('step_clock_diluted')}: the price, not the clock. From those records to the "
            f"wall-clock ones `drop` moved {_signed(drop['wall_clock'] - drop['step_clock_diluted'])} (to "
            f"{drop['wall_clock']:.3f}) and `mecefo` {_signed(ours['wall_clock'] - ours['step_clock_diluted'])} (to "
            f"{ours['wall_clock']:.3f}), leaving `drop` − `mecefo` at {gap('wall_clock')}. `drop`'s step ratio is 1, "
            f"so the clock leaves its outages as they were: its move is the data orders (seed 0, whose data order "
            f"both records share, moved {drop['seed0']['step_clock_diluted']:.4f} → "
            f"{drop['seed0']['wall_clock']:.4f}). "
            f"Seed 0 shows the clock's own effect on `mecefo`: {ours['seed0']['step_clock_diluted']:.4f} → "
            f"{ours['seed0']['wall_clock']:.4f} "
            f"({_signed(ours['seed0']['wall_clock'] - ours['seed0']['step_clock_diluted'])}).")


def point_paragraph(report: dict, name: str) -> str:
    """One point's verdict under each step cost."""
    p, gpu = report['points'][name], vr.GPU
    c = p['costs']
    diff = c[gpu]['paired'][MECEFO]
    others = '; '.join(f"{e['name']} {cell(e['paired'][MECEFO], '+.3f')}" for label, e in c.items() if label != gpu)
    best = '; '.join(f"{e['name']}: `{e['map']['best']}`" for e in c.values())
    capped = _capped(name)
    text = (f"{len(p['seeds'])} seeds. On {vr.COSTS[gpu][0]} costs `drop` {_g(p, DROP, gpu)}, the paper's rule "
            f"{_g(p, MECEFO, gpu)}: `drop` − `mecefo` {cell(diff, '+.3f')}, {diff['seeds_needed']} seeds to "
            f"separate at this variance; {others}. The best mean, {best}. Behind `drop` under every step cost by an "
            f"interval that excludes 0: {_join(_behind_everywhere(p))}. Steps to target against `drop`: the paper's "
            f"rule {cell(p['paired_steps'][MECEFO], '+.1f')}, the capped plan "
            f"{cell(p['paired_steps'][capped], '+.1f')}.")
    if CONTROL in p['runs']:
        text += (f" Against the control that drops exactly the rows the paper's rule approximates, `mecefo` − "
                 f"`{CONTROL}` is {cell(c[gpu]['vs_control'][MECEFO], '+.3f')} on {vr.COSTS[gpu][0]} costs, and v "
                 f"{cell(p['v'], '.2f')}.")
    bound = diff['clock_bound']
    text += (f" The records' clock could move `drop` − `mecefo` here by ±{bound:.3f}"
             + (', which keeps it on its side of 0.' if diff['side_with_bound'] == diff['side'] else
                ', which could take it across 0.'))
    falls = p['fault_free_falls_at_last_eval']
    text += f' The fault-free validation loss still fell at its last evaluation in {sum(falls)} of {len(falls)} seeds.'
    helper = p['break_even_helper_step']
    text += (f" Re-timing the records, the capped plan would keep up with `drop` with a helper under "
             f"{fmt(helper.get(capped), '.3f')}x a normal step, the paper's rule under "
             f"{fmt(helper.get(MECEFO), '.3f')}x.")
    return text


def hours_sentence(report: dict) -> str:
    hours = sum(p['hours']['wall'] for p in report['points'].values())
    return (f"The records took {hours:.2f} hours of training on this project's 2-core machine, time held by other "
            "work included (the report's clock table gives each point's share).")


def readme_claims(report: dict) -> list[str]:
    """What README.md must hold: its map, the paragraph under it and its goodput row."""
    return [vr.map_table(report, readme=True), readme_summary(report), goodput_row(report)]


def docs_claims(report: dict) -> list[str]:
    """What docs/verdict.md must hold, beside its map."""
    return [vr.map_table(report), model_table(report), model_paragraph(report), phi_paragraph(report),
            replay_paragraph(report),
            bound_paragraph(report), attribution_paragraph(report), readme_summary(report), hours_sentence(report),
            *(point_paragraph(report, name) for name in report['points'])]
