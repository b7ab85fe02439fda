"""The cache-layers drill's table (tests/drills/cache_layers.py): what leaving each layer out adds."""
import pytest

from tests.drills import cache_layers


def _runs(*pairs):
    return [{'failure': {'recovery_sec': f}, 'rejoin': {'recovery_sec': r}} for f, r in pairs]


def test_each_layer_is_priced_against_every_layer_by_medians():
    table = cache_layers.table({'all': _runs((10, 8), (12, 9), (11, 30)),
                                'no_compile_ahead': _runs((40, 9), (30, 9), (41, 9)),
                                'none': _runs((50, 20))})
    assert table['median_recovery_sec']['all'] == {'failure': 11, 'rejoin': 9}
    assert table['repeats'] == {'all': 3, 'no_compile_ahead': 3, 'none': 1}
    ahead = table['layers']['compile_ahead']
    assert ahead['failure'] == {'recovery_without_sec': 40, 'saves_sec': 29, 'share': 29 / 40}
    assert ahead['rejoin']['saves_sec'] == 0
    assert table['layers']['every_cache']['rejoin']['share'] == pytest.approx(11 / 20)
    assert set(table['layers']) == {'compile_ahead', 'every_cache'}  # the variants not run are not priced


def test_a_subset_must_name_known_variants_and_all():
    for variants in (('no_untraced',), ('all', 'no_cache')):
        with pytest.raises(ValueError, match="'all' among them"):
            cache_layers.run(None, '/nonexistent', repeats=1, workers=2, nodes=1, kill_step=1,
                             return_after=1, variants=variants)
