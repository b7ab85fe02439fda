"""gpu_report.md: one markdown table per section (no jax: the report process formats it)."""
from __future__ import annotations

from studies.report import fmt, markdown_table

MIB = 2 ** 20
GIB = 2 ** 30


def _table(header, rows) -> list[str]:
    return markdown_table(header, rows).splitlines()


def _scaled(value, scale, spec='.1f'):
    return fmt(None if value is None else value / scale, spec)


def environment(r) -> list[str]:
    cuda, pk = r.get('cuda') or {}, r.get('packages') or {}
    rows = [('device', f"{r['device_count']} x {r['platform']}:{r['device_kind']}"),
            ('device memory (allocator limit)',
             _scaled(r.get('device_memory_bytes'), GIB) + ' GiB'),
            ('host memory', _scaled(r.get('host_memory_bytes'), GIB) + ' GiB'),
            ('CPU cores', r.get('cpu_count'))]
    rows += [(name, pk[name]) for name in ('jax', 'jaxlib', 'jax-cuda12-plugin', 'flax', 'optax')
             if name in pk]
    rows += [(name.replace('_', ' '), value) for name, value in cuda.items()]
    return _table(('figure', 'value'), rows)


def step(r) -> list[str]:
    modes, ratios, details = r.get('modes') or {}, r.get('ratios') or {}, r.get('details') or {}
    rows = []
    for mode, v in modes.items():
        x, d = ratios.get(mode, {}), details.get(mode, {})
        rows.append((mode, d.get('rows', ''), fmt(v['step_ms'], '.2f'),
                     fmt(x.get('step_ms'), '.3f'),
                     _scaled(v.get('flops'), 1e9, '.4g'), fmt(x.get('flops'), '.3f'),
                     _scaled(v.get('peak_bytes'), MIB), _scaled(v.get('device_peak_bytes'), MIB),
                     fmt(d.get('compile_sec'), '.1f')))
    lines = [f"{r.get('config_name')} on {r.get('device')}, batch {r.get('batch')} x "
             f"{(r.get('config') or {}).get('seq_len')} (asked {r.get('batch_requested')}, "
             f"{r.get('batch_source')}; {(r.get('fit') or {}).get('note', '')})", '']
    lines += _table(('mode', 'rows', 'step ms', 'x normal', 'matmul GFLOP', 'x normal',
                     'planned peak MiB', 'device peak MiB', 'compile s'), rows)
    if r.get('skipped_modes'):
        lines += ['', f"Not compiled for lack of time: {', '.join(r['skipped_modes'])}."]
    m = r.get('mfu') or {}
    if m:
        lines += ['', f"MFU of normal: {fmt(m.get('formula'), '.1%')} (6 N + attention FLOPs), "
                      f"{fmt(m.get('matmuls'), '.1%')} (the compiled step's matmuls), of "
                      f"{_scaled(m.get('peak_flops'), 1e12, '.0f')} TFLOP/s."]
    if r.get('bench_json'):
        lines += ['', f"Wrote `{r['bench_json']}` (simulator: `--cost bench --bench_json`)."]
    return lines


def _settings(c) -> str:
    return (f"{c['attention']}, remat {c['remat_policy']}, "
            f"{'scanned' if c['scan_layers'] else 'unrolled'}, "
            f"{'flat' if c['flat_optimizer'] else 'per-leaf'} AdamW"
            + (f", `{c['xla_flags']}`" if c.get('xla_flags') else ''))


def _cell_row(c) -> tuple:
    return (c['model'], c['tokens_per_device'], c['seq_len'], _settings(c),
            fmt(c.get('step_ms'), '.2f'), fmt(c.get('tokens_per_sec'), ',.0f'),
            fmt(c.get('mfu'), '.1%'), fmt(c.get('mfu_matmuls'), '.1%'), fmt(c.get('peak_mib'), ',.0f'))


def sweep(r) -> list[str]:
    """The best cell per model and batch, the drift check, then every cell in order."""
    head = ('model', 'tokens a device', 'seq', 'settings', 'step ms', 'tokens/s', 'MFU',
            'MFU (matmuls)', 'planned peak MiB')
    best = [c for batches in (r.get('best_by_batch') or {}).values() for c in batches.values()]
    lines = ['Best cell per model and batch (MFU: 6 N + attention FLOPs over 989 TFLOP/s; '
             "matmuls: the compiled step's, remat recomputation included):", '']
    lines += _table(head, [_cell_row(c) for c in best])
    lines += ['', 'Best per model:', '']
    lines += _table(head, [_cell_row(c) for c in (r.get('best') or {}).values()])
    drift = r.get('drift') or {}
    lines += ['', 'Drift (the baseline cell rerun at the end): ' + (', '.join(
        f"{m} {d['first_ms']:.2f} -> {d['rerun_ms']:.2f} ms (x{d['ratio']:.3f})"
        for m, d in drift.items()) or 'not run'), '']
    rows = [(i, c['stage'], 'kept' if c.get('accepted') else '', *_cell_row(c),
             'does not fit' if not c.get('fits') else (c.get('error') or '')[:80])
            for i, c in enumerate(r.get('cells') or [])]
    return lines + _table(('#', 'stage', 'kept', *head, 'note'), rows)


def profile(r) -> list[str]:
    cats = r.get('categories') or {}
    total = sum(cats.values()) or 1.0
    lines = [f"{r.get('config_name')}, batch {r.get('batch')} x {r.get('seq_len')}, "
             f"{r.get('steps')} steps traced ({r.get('source')} events): "
             f"{fmt(r.get('window_ms_per_step'), '.2f')} ms a step from first to last op, "
             f"{fmt(r.get('idle_ms_per_step'), '.2f')} ms of it idle", '']
    lines += _table(('where', 'ms a step', 'share of op time'),
                    [(k, fmt(v, '.3f'), fmt(v / total, '.1%')) for k, v in cats.items()])
    lines += ['', 'Largest ops:', '']
    return lines + _table(('op', 'where', 'ms a step'),
                          [(o['op'], o['category'], fmt(o['ms_per_step'], '.3f'))
                           for o in r.get('top_ops') or []])


def attention(r) -> list[str]:
    rows = [(impl, fmt(r[impl]['forward_ms'], '.3f'), fmt(r[impl]['forward_backward_ms'], '.3f'))
            for impl in ('cudnn', 'xla') if impl in r]
    lines = [f"q {r.get('shape_blhe')} (B, L, heads, head dim), {r.get('kv_heads')} KV heads, "
             f"{r.get('dtype')}, causal", '']
    lines += _table(('implementation', 'forward ms', 'forward + backward ms'), rows)
    if 'max_abs_diff' in r:
        lines += ['', 'max |cudnn - xla| (max |xla|): ' + ', '.join(
            f"{k} {v:.3g} ({r['max_abs_xla'][k]:.3g})" for k, v in r['max_abs_diff'].items())]
    return lines


def refresh(r) -> list[str]:
    rows = []
    for name, m in (r.get('models') or {}).items():
        for s in m['shapes'].values():
            rows.append((name, 'x'.join(map(str, s['shape'])), s['rank'], fmt(s['svd_sec'], '.4f'),
                         fmt(s.get('cheap_sec'), '.4f'), fmt(s.get('cheap_energy_ratio'), '.4f'),
                         fmt(m.get('svd_model_sec'), '.4g'), fmt(m.get('cheap_model_sec'), '.4g')))
    lines = [f"cheap refresh: {r.get('cheap_refresh')}; whole model: {r.get('extrapolation')}", '']
    return lines + _table(('model', 'matrix', 'r', 'SVD s', 'cheap s', 'cheap energy',
                           'model SVD s', 'model cheap s'), rows)


def snapshot(r) -> list[str]:
    b, a = r.get('bandwidth') or {}, r.get('auto') or {}
    rows = [('train state', _scaled(b.get('state_bytes'), MIB) + ' MiB'),
            ('device_get', fmt(b.get('device_get_gbps'), '.2f') + ' GB/s'),
            ('pinned host copy', fmt(b.get('pinned_copy_gbps'), '.2f') + ' GB/s'
             + (f" ({b['pinned_copy_error']})" if 'pinned_copy_error' in b else '')),
            ('plain host copy (np.copyto)', fmt(b.get('host_copy_gbps'), '.2f') + ' GB/s'),
            ('step without snapshots', _scaled(r.get('step_sec'), 1e-3, '.2f') + ' ms')]
    for key, label in (('every_1', 'every=1, waiting for writes'),
                       ('every_1_latest_wins', 'every=1, never waiting')):
        e = r.get(key) or {}
        write_gbps = (e['write_bytes_per_snapshot'] / e['write_sec_per_snapshot'] / 1e9
                      if e.get('write_sec_per_snapshot') else None)
        rows += [(f'step, {label}', _scaled(e.get('step_sec'), 1e-3, '.2f') + ' ms'),
                 (f'overhead, {label}', fmt(e.get('overhead_pct'), '.1f') + ' %'),
                 (f'blocked per snapshot, {label}',
                  _scaled(e.get('blocked_sec_per_snapshot'), 1e-3, '.1f') + ' ms'),
                 (f'background write per snapshot, {label}',
                  _scaled(e.get('write_sec_per_snapshot'), 1e-3, '.1f') + ' ms ('
                  + fmt(write_gbps, '.2f') + ' GB/s)')]
        if key == 'every_1_latest_wins' and e:
            rows.append(('snapshots written / dropped, never waiting',
                         f"{e.get('published')} / {e.get('dropped')}"))
    if a.get('status') == 'ok':
        rows.append((f"overhead, every=auto (interval {a['interval']}, budget {a['budget_pct']} %)",
                     fmt(a.get('overhead_pct'), '.2f') + ' %'))
        c = a.get('chosen') or {}
        if 'reason' in c:
            rows.append(('overhead at the chosen interval alone', f"n/a: {c['reason']}"))
        elif c:
            rows.append((f"overhead at the chosen interval alone ({c['steps']} steps, "
                         f"{c['published']} written, {c['dropped']} dropped)",
                         fmt(c['overhead_pct'], '.2f') + ' %'))
    elif a:
        rows.append(('every=auto', f"n/a: {a.get('reason')}"))
    return _table(('figure', 'value'), rows)


def compile_(r) -> list[str]:
    return _table(('program', 'layers', 'devices', 'compile s'),
                  [(r.get('what'), r.get('num_layers'), r.get('devices'),
                    fmt(r.get('compile_sec'), '.2f'))])


FORMATTERS = {'environment': environment, 'sweep': sweep, 'step': step, 'step_best': step,
              'step_1b': step, 'profile': profile, 'attention': attention, 'refresh': refresh,
              'snapshot': snapshot, 'compile': compile_}


def section(name: str, result: dict) -> list[str]:
    """A heading with the status, then the section's table (of partial figures if it stopped)."""
    status = result['status']
    lines = [f"## {name}: {status} ({fmt(result.get('wall_sec'), '.1f')} s of "
             f"{fmt(result.get('limit_sec'), '.0f')} s, "
             f"{fmt(result.get('cpu_sec'), '.1f')} CPU s)", '']
    if status in ('failed', 'timeout'):
        lines += [f"{result.get('error')}", '']
    if status == 'skipped':
        lines += [f"Skipped: {result.get('reason')}", '']
    figures = result.get('partial', result) if status in ('failed', 'timeout') else result
    formatter = FORMATTERS.get(name)
    if formatter is not None and figures:
        try:
            lines += formatter(figures)
        except (KeyError, TypeError, AttributeError) as error:
            lines += [f'(no table: figures incomplete, {type(error).__name__}: {error})']
    return lines + ['']


def markdown(report: dict) -> str:
    meta = report['meta']
    lines = ['# GPU report', '',
             f"{meta['started_utc']}, {'smoke (tiny shapes)' if meta['smoke'] else 'full'}; "
             f"{meta['wall_sec']:.0f} s of a {meta['budget_sec']:.0f} s budget.", '']
    for name, result in report['sections'].items():
        lines += section(name, result)
    return '\n'.join(lines)
