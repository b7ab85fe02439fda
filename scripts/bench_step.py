"""Per-device train-step cost of normal / naive NDB / MeCeFO / plain DP: see mecefo_jax/experiments/step_cost.py.

  python scripts/bench_step.py --config configs/llama_350m.py \
      --config.data.seq_len=256 --config.mecefo.rank=128 --iters 0 --out /tmp/bench
  python scripts/bench_step.py --config configs/small.py --out /tmp/bench_small

Needs only jax, flax, optax, orbax-checkpoint and numpy: the config file and
its `--config.a.b=value` overrides go through mecefo_jax/cli.py, not
ml_collections. On a CPU host the process simulates `mesh.num_cpu_devices`
devices (for the fault-free overhead check on the config's full mesh).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog='Override any config field with --config.SECTION.FIELD=VALUE.')
    parser.add_argument('--config', required=True, help='Path to a configs/*.py file.')
    parser.add_argument('--out', required=True, help='Directory for bench_step.json.')
    parser.add_argument('--batch', type=int, default=4,
                        help='Sequences per shard (the per-device batch).')
    parser.add_argument('--warmup', type=int, default=2, help='Untimed rounds before timing.')
    parser.add_argument('--iters', type=int, default=5,
                        help='Timed rounds (median reported); 0 = FLOPs and memory only.')
    parser.add_argument('--overhead_iters', type=int, default=30,
                        help='Timed rounds of the fault-free vs plain_dp check.')
    parser.add_argument('--no_overhead', action='store_true',
                        help='Skip the fault-free vs plain_dp timing on the full mesh.')
    parser.add_argument('--peak_tflops', type=float, default=None,
                        help='Device peak for MFU (GPU); default: known-device table.')
    parser.add_argument('--seed', type=int, default=0,
                        help='Seed of the parameters and random tokens.')
    return parser


def main(argv=None):
    from mecefo_jax import cli
    args, cfg = cli.parse(build_parser(), argv)
    # Before jax starts: fake CPU devices for the full-mesh overhead check
    # (ignored by GPU backends).
    from mecefo_jax.sharding import simulate_cpu_devices
    simulate_cpu_devices(int(cfg.mesh.num_cpu_devices))
    from mecefo_jax.experiments import step_cost as bench
    bench.main(cfg, args.out, batch=args.batch, warmup=args.warmup, iters=args.iters,
               overhead=not args.no_overhead, overhead_iters=args.overhead_iters,
               peak_tflops=args.peak_tflops, seed=args.seed)


if __name__ == '__main__':
    main()
