"""One process of the two-process test in multihost_test.py (not a test itself).

    python tests/multihost_driver.py --coordinator localhost:PORT --num_processes 2 \
        --process_id I --workdir DIR --cache_dir DIR --out FILE.npz [--steps N]
        [--events S:R:D,...] [--strategy NAME] [--tokenizer_paths FILE,FILE,...]

Each process runs `run.run` under failures on the global 8-device mesh (4 local
CPU devices each) and writes, to --out, every parameter leaf as this process
sees it (after checking its own local copies agree bit for bit) plus the
summary's events, the devices holding the final params, the params captured
right after the first step run during a failure, the sha256 of the tokenizer
each data pipeline used and how many tokenizers this process trained.

With --tokenizer_paths it only loads each of those tokenizers in turn (the
multi-host agreement on data.tokenizer_path) and writes, per path, the model's
sha256 or the error raised to FILE.npz.json.
"""
import argparse
import json
import os
import sys


def _parse():
    p = argparse.ArgumentParser()
    p.add_argument('--coordinator', required=True)
    p.add_argument('--num_processes', type=int, required=True)
    p.add_argument('--process_id', type=int, required=True)
    p.add_argument('--workdir', required=True)
    p.add_argument('--cache_dir', required=True)
    p.add_argument('--out', required=True)
    p.add_argument('--steps', type=int, default=8)
    p.add_argument('--events', default='2:3:3')
    p.add_argument('--strategy', default='mecefo')
    p.add_argument('--local_devices', type=int, default=4)
    p.add_argument('--tokenizer_paths', default='')
    return p.parse_args()


def main():
    args = _parse()
    # This process's own fake-device count replaces any inherited one (the
    # pytest process runs with 8); other XLA flags from the caller are kept.
    inherited = [f for f in os.environ.get('XLA_FLAGS', '').split()
                 if 'xla_force_host_platform_device_count' not in f]
    os.environ['XLA_FLAGS'] = ' '.join(
        inherited + [f'--xla_force_host_platform_device_count={args.local_devices}'])
    os.environ['JAX_PLATFORMS'] = 'cpu'
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, repo)

    import jax
    import numpy as np
    # jax 0.10.2 defaults jax_cpu_collectives_implementation to 'gloo', which is
    # what cross-process CPU collectives need; set it anyway for older defaults.
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    jax.distributed.initialize(coordinator_address=args.coordinator,
                               num_processes=args.num_processes,
                               process_id=args.process_id)

    from configs.tiny import get_config
    from mecefo_jax import run as run_lib
    from mecefo_jax.config.resolve import resolve, updated
    from mecefo_jax.data import tokenizer as tokenizer_lib
    from mecefo_jax.training import run_setup
    from mecefo_jax.training.observers import Observer

    trainings = []
    real_train = tokenizer_lib.train_sentencepiece

    def counting_train(texts, vocab_size):
        trainings.append(vocab_size)
        return real_train(texts, vocab_size)
    tokenizer_lib.train_sentencepiece = counting_train

    cfg = updated(resolve(get_config()), {'data.cache_dir': args.cache_dir})
    if args.tokenizer_paths:
        outcomes = []
        for path in args.tokenizer_paths.split(','):
            cfg = updated(cfg, {'data.tokenizer_path': path})
            try:
                tokenizer = tokenizer_lib.load_or_train_tokenizer(
                    cfg.data, cfg.model.vocab_size, lambda: [])
                outcomes.append({'sha256': tokenizer.model_sha256})
            except (OSError, ValueError, RuntimeError) as error:
                outcomes.append({'error': f'{type(error).__name__}: {error}'})
        with open(args.out + '.json', 'w') as f:
            json.dump({'tokenizer_paths': outcomes}, f)
        jax.distributed.shutdown()
        return
    cfg = updated(cfg, {'train.steps': args.steps, 'train.eval_every': 0,
                       'train.checkpoint_every': 0, 'train.log_every': 1,
                       'fault.strategy': args.strategy, 'fault.events': args.events})

    captured = {}

    def local_copy(tree):
        """Leaf path -> this process's value; all its local shards must agree."""
        out = {}
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
            name = jax.tree_util.keystr(path)
            by_index = {}
            for shard in leaf.addressable_shards:
                key = tuple((s.start, s.stop) for s in shard.index)
                value = np.asarray(shard.data)
                if key in by_index:
                    np.testing.assert_array_equal(
                        value, by_index[key], err_msg=f'{name}: local replicas differ')
                else:
                    by_index[key] = value
            assert len(by_index) == 1, f'{name}: expected replicated params, got {list(by_index)}'
            out[name] = next(iter(by_index.values()))
        return out

    class Capturing(Observer):
        def on_step(self, done):
            if not all(done.live) and 'during' not in captured:
                captured['during'] = local_copy(done.state.params)
                captured['during_live'] = int(sum(done.live))
                captured['during_devices'] = sorted(
                    {d.id for leaf in jax.tree.leaves(done.state.params)
                     for d in leaf.sharding.device_set})

    run = run_setup.build_run(cfg, args.workdir)
    captured['tokenizer_sha256'] = {'train': run.train_data.tokenizer.model_sha256,
                                    'validation': run.val_data.tokenizer.model_sha256}
    summary = run_lib.run(cfg, args.workdir, run=run, observers=[Capturing()])
    final = local_copy(summary['state'].params)
    arrays = {f'final{k}': v for k, v in final.items()}
    arrays.update({f'during{k}': v for k, v in captured.get('during', {}).items()})
    meta = {'events': [{k: e[k] for k in ('kind', 'step', 'replicas', 'live')}
                       for e in summary['events']],
            'final_devices': sorted({d.id for leaf in jax.tree.leaves(summary['state'].params)
                                     for d in leaf.sharding.device_set}),
            'during_live': captured.get('during_live'),
            'during_devices': captured.get('during_devices'),
            'final_loss': summary['final_loss'],
            'final_val_loss': summary['final_val_loss'],
            'tokenizer_sha256': captured.get('tokenizer_sha256'),
            'tokenizer_trainings': len(trainings),
            'process_index': jax.process_index(),
            'process_count': jax.process_count(),
            'global_devices': jax.device_count(),
            'local_devices': jax.local_device_count()}
    np.savez(args.out, **arrays)
    with open(args.out + '.json', 'w') as f:
        json.dump(meta, f)
    jax.distributed.shutdown()


if __name__ == '__main__':
    main()
