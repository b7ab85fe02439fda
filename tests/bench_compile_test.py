"""scripts/bench_compile.py end to end on the tiny config, one depth (figures are not asserted)."""
import json

from configs.tiny import get_config
from mecefo_jax.config.resolve import resolve
from studies import compile_time as bench_compile


def test_compiles_the_failure_step_scanned_and_looped_and_writes_json(tmp_path):
    result = bench_compile.run(resolve(get_config()), [1], str(tmp_path), log=lambda _: None)
    with open(tmp_path / 'bench_compile.json') as f:
        assert json.load(f) == json.loads(json.dumps(result))
    assert [(r['scan_layers'], r['num_layers']) for r in result['rows']] == [(True, 1), (False, 1)]
    assert all(r['compile_sec'] > 0 and r['ratio_to_shallowest'] == 1.0 for r in result['rows'])
