"""Where each strategy puts the global batch when replicas are down (pure, no devices)."""
import math

import numpy as np
import pytest

from mecefo_jax.config.defaults import CONTROLS, STRATEGIES
from mecefo_jax.faults.strategies import REGISTRY, AllReplicasDownError, adopters, layout_for, ring_order
from mecefo_jax.neighbour.layout import ROLE_NEIGHBOUR, ROLE_NORMAL, Program, assemble

N = 8
B = 4  # examples per shard


def mask(n=N, down=()):
    return tuple(r not in down for r in range(n))


def example_counts(layout, num_shards=N, shard_batch=B):
    """counts[shard, example]: how often each example is computed."""
    counts = np.zeros((num_shards, shard_batch), int)
    for pieces in layout.pieces:
        for p in pieces:
            counts[p.shard, p.start:p.stop] += 1
    return counts


def examples_per_replica(layout):
    return {r: sum(p.size for p in pieces) for r, pieces in zip(layout.replicas, layout.pieces)}


def ring_distance(a, b, n=N):
    return min((a - b) % n, (b - a) % n)


def adopted_by(layout):
    """Failed shard -> live replicas computing part of it."""
    out = {}
    for r, pieces in zip(layout.replicas, layout.pieces):
        for p in pieces:
            if p.shard != r:
                out.setdefault(p.shard, []).append(r)
    return out


# Masks exercising single, adjacent, wrap-around and heavy failures.
MASKS = [mask(), mask(down=(3,)), mask(down=(0,)), mask(down=(7,)), mask(down=(3, 4)),
         mask(down=(0, 7)), mask(down=(1, 2, 3)), mask(down=(0, 2, 4, 6)),
         mask(down=tuple(range(1, N)))]
RNG_MASKS = [tuple(bool(x) for x in m) for m in np.random.default_rng(0).integers(0, 2, (40, N))
             if any(m)]


@pytest.mark.parametrize('strategy', STRATEGIES)
@pytest.mark.parametrize('live', MASKS + RNG_MASKS)
def test_every_example_computed_exactly_once(strategy, live):
    layout = layout_for(strategy, live, B)
    counts = example_counts(layout)
    live_shards = [r for r in range(N) if live[r]]
    assert layout.replicas == tuple(live_shards)
    for shard in range(N):
        if strategy == 'drop' and not live[shard]:
            assert (counts[shard] == 0).all(), f'drop computed failed shard {shard}'
        else:
            assert (counts[shard] == 1).all(), (strategy, live, shard, counts[shard])
    expected = {s: B for s in range(N) if live[s] or strategy != 'drop'}
    assert layout.shards_covered() == expected
    # Each live replica always computes its own shard itself, first.
    for r, pieces in zip(layout.replicas, layout.pieces):
        own = [p for p in pieces if p.shard == r]
        assert sum(p.size for p in own) == B
        assert list(pieces[:len(own)]) == own


@pytest.mark.parametrize('strategy', STRATEGIES)
def test_assemble_holds_the_global_batch_rows(strategy):
    live = mask(down=(3, 4))
    layout = layout_for(strategy, live, B)
    tokens = np.arange(N * B * 5, dtype=np.int32).reshape(N, B, 5)
    batch = assemble(layout, tokens)
    rows = batch['tokens'].reshape(-1, 5)[batch['weights'].reshape(-1) > 0]
    kept = [s for s in range(N) if live[s] or strategy != 'drop']
    expected = tokens[kept].reshape(-1, 5)
    assert sorted(map(tuple, rows)) == sorted(map(tuple, expected))
    np.testing.assert_array_equal(batch['programs'], layout.program_index())
    roles = [layout.programs[k].role for k in batch['programs']]
    assert tuple(roles) == layout.roles


def test_ring_order_is_by_distance_next_first():
    assert ring_order(3, mask()) == [4, 2, 5, 1, 6, 0, 7]
    assert ring_order(0, mask()) == [1, 7, 2, 6, 3, 5, 4]
    assert ring_order(7, mask()) == [0, 6, 1, 5, 2, 4, 3]
    assert ring_order(3, mask(down=(3, 4))) == [2, 5, 1, 6, 0, 7]


@pytest.mark.parametrize('live, expected', [
    (mask(down=(3,)), {3: 4}),  # tie 2/4: the next one on the ring
    (mask(down=(0,)), {0: 1}),
    (mask(down=(7,)), {7: 0}),  # wrap-around at the top end
    (mask(down=(0, 1)), {0: 7, 1: 2}),  # wrap-around at the bottom end
    (mask(down=(6, 7)), {6: 5, 7: 0}),
    (mask(down=(3, 4)), {3: 2, 4: 5}),  # adjacent double failure: both sides
    (mask(down=(0, 7)), {0: 1, 7: 6}),  # adjacent across the wrap
])
def test_adopter_is_nearest_live_ring_neighbour(live, expected):
    assert adopters(live) == expected
    for strategy in ('mecefo', 'ndb_naive'):
        assert {s: rs for s, rs in adopted_by(layout_for(strategy, live, B)).items()} == {
            s: [r] for s, r in expected.items()}


@pytest.mark.parametrize('live', MASKS[1:] + RNG_MASKS)
def test_adopter_is_always_at_minimal_ring_distance(live):
    live_replicas = [r for r in range(N) if live[r]]
    for failed, adopter in adopters(live).items():
        assert live[adopter] and not live[failed]
        assert ring_distance(failed, adopter) == min(ring_distance(failed, r)
                                                     for r in live_replicas)


def test_adopter_failing_reassigns_its_own_and_adopted_shards():
    before = layout_for('mecefo', mask(down=(3,)), B)
    assert adopted_by(before) == {3: [4]}
    after = layout_for('mecefo', mask(down=(3, 4)), B)  # the adopter 4 fails too
    assert 4 not in after.replicas
    assert adopted_by(after) == {3: [2], 4: [5]}
    assert (example_counts(after) == 1).all()
    roles = dict(zip(after.replicas, after.roles))
    assert roles[2] == roles[5] == ROLE_NEIGHBOUR
    assert all(roles[r] == ROLE_NORMAL for r in roles if r not in (2, 5))


def test_one_replica_adopts_several_shards():
    live = (True, False, False, False)  # 4 replicas, only 0 left
    layout = layout_for('mecefo', live, B)
    assert layout.replicas == (0,)
    assert [p.shard for p in layout.pieces[0]] == [0, 1, 2, 3]
    assert layout.roles == (ROLE_NEIGHBOUR,)
    assert layout.programs == (Program(ROLE_NEIGHBOUR, 4 * B),)  # one joined batch
    # Runs of failures on both sides of a replica pile onto the nearest ones.
    live = mask(down=(1, 2, 3))
    assert adopters(live) == {1: 0, 2: 4, 3: 4}
    layout = layout_for('mecefo', live, B)
    per_replica = examples_per_replica(layout)
    assert per_replica[4] == 3 * B and per_replica[0] == 2 * B
    assert layout.signature == (5, (Program(ROLE_NORMAL, B), Program(ROLE_NEIGHBOUR, 3 * B)))
    assert layout.capacity == 3 * B
    assert (example_counts(layout) == 1).all()


@pytest.mark.parametrize('strategy', STRATEGIES)
def test_every_example_once_over_random_masks_and_shard_sizes(strategy):
    rng = np.random.default_rng(1)
    for _ in range(30):
        n, shard = int(rng.integers(2, 13)), int(rng.integers(1, 9))
        live = tuple(bool(x) for x in rng.integers(0, 2, n))
        if not any(live):
            continue
        counts = example_counts(layout_for(strategy, live, shard), n, shard)
        want = np.array([[1 if live[s] or strategy != 'drop' else 0] * shard for s in range(n)])
        assert (counts == want).all(), (strategy, live, shard)


@pytest.mark.parametrize('strategy', ['mecefo', 'mecefo_planned'])
@pytest.mark.parametrize('live', MASKS + RNG_MASKS)
def test_mecefo_roles_neighbour_for_adopters_only(strategy, live):
    layout = layout_for(strategy, live, B)
    helpers = {r for rs in adopted_by(layout).values() for r in rs}
    for r, role in zip(layout.replicas, layout.roles):
        assert role == (ROLE_NEIGHBOUR if r in helpers else ROLE_NORMAL), (r, helpers)
    if all(live):
        assert set(layout.roles) == {ROLE_NORMAL}


@pytest.mark.parametrize('strategy', ['ndb_naive', 'elastic', 'checkpoint_restart', 'drop'])
@pytest.mark.parametrize('live', MASKS + RNG_MASKS)
def test_exact_strategies_all_normal(strategy, live):
    assert set(layout_for(strategy, live, B).roles) == {ROLE_NORMAL}


def test_ndb_naive_places_like_mecefo():
    for live in MASKS + RNG_MASKS:
        a, b = layout_for('mecefo', live, B), layout_for('ndb_naive', live, B)
        assert (a.replicas, a.pieces) == (b.replicas, b.pieces)


@pytest.mark.parametrize('strategy', ['elastic', 'checkpoint_restart'])
def test_elastic_spreads_over_every_live_replica(strategy):
    live = mask(down=(3,))
    layout = layout_for(strategy, live, 7)  # 7 examples over 7 live replicas
    per_replica = examples_per_replica(layout)
    assert set(per_replica.values()) == {8}
    assert layout.programs == (Program(ROLE_NORMAL, 8),) and layout.is_plain
    live = mask(down=(1, 2))  # 14 examples over 6 replicas: nobody beyond 3 extra
    per_replica = examples_per_replica(layout_for(strategy, live, 7))
    assert max(per_replica.values()) - min(per_replica.values()) <= 1


@pytest.mark.parametrize('strategy', ['elastic', 'checkpoint_restart'])
@pytest.mark.parametrize('live', MASKS[1:] + RNG_MASKS)
def test_elastic_busiest_device_takes_its_shard_plus_its_share_in_one_batch(strategy, live):
    """The strongest re-split: shard + ceil(orphans / live) examples, one program."""
    layout = layout_for(strategy, live, B)
    live_count = sum(live)
    orphans = (N - live_count) * B
    assert max(examples_per_replica(layout).values()) == B + math.ceil(orphans / live_count)
    assert len(layout.programs) == 1 and layout.is_plain  # no branching, no per-slot overhead


@pytest.mark.parametrize('strategy', STRATEGIES)
def test_full_mesh_is_plain_data_parallelism(strategy):
    layout = layout_for(strategy, mask(), B)
    assert [[(p.shard, p.start, p.stop) for p in pieces] for pieces in layout.pieces] == [
        [(r, 0, B)] for r in range(N)]
    assert layout.signature == (N, (Program(ROLE_NORMAL, B),)) and layout.is_plain
    assert set(layout.roles) == {ROLE_NORMAL}


@pytest.mark.parametrize('strategy', STRATEGIES)
def test_all_down_raises(strategy):
    with pytest.raises(AllReplicasDownError, match='down'):
        layout_for(strategy, (False,) * N, B)
    with pytest.raises(AllReplicasDownError):
        adopters((False,) * N)


def test_an_unknown_strategy_is_named_with_the_known_ones():
    with pytest.raises(ValueError, match=r"strategy 'bamboo' is unknown.*mecefo"):
        layout_for('bamboo', mask(), B)


def test_every_strategy_the_config_names_has_one_spec_in_its_order():
    """`fault.strategy`'s values are declared in the config; the registry gives each one
    spec, in the order reports list them, the controls last."""
    assert tuple(spec.name for spec in REGISTRY) == STRATEGIES + CONTROLS
    assert all(spec.control == (spec.name in CONTROLS) for spec in REGISTRY)
