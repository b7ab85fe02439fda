"""Per-device train-step memory, normal and neighbour roles: see mecefo_jax/experiments/memory_plan.py.

  python scripts/memory_plan.py --config configs/llama_7b.py --num_devices 32 --out /tmp/plan

Compiles ahead of time on fake CPU devices with no parameters materialised.
One replica's devices (mesh.model of them) would suffice to compile one
device's program; two replicas are compiled (2 x mesh.model fake devices),
which adds the real all-reduce (see mecefo_jax/experiments/memory_plan.py). Needs only jax, flax, optax and numpy.
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
    parser.add_argument('--num_devices', type=int, default=32,
                        help='Devices of the planned cluster (mesh.data=-1 resolves against '
                             'it); default 32 = 4 nodes x 8 GPUs, as in the paper.')
    parser.add_argument('--limit_gb', type=float, default=70.0,
                        help='Per-device budget the plan checks against (GB = 1e9 bytes).')
    parser.add_argument('--failure_step', action='store_true',
                        help='Also compile the lax.switch step devices run during a failure '
                             '(one normal and one neighbour replica).')
    parser.add_argument('--out', default=None, help='Directory for memory_plan.json.')
    return parser


def main(argv=None):
    from mecefo_jax import cli
    args, cfg = cli.parse(build_parser(), argv)
    if args.num_devices < 1:
        raise SystemExit(f'--num_devices={args.num_devices} must be >= 1.')
    # Before jax starts: fake CPU devices for the replicas compiled.
    from mecefo_jax.sharding import mesh_shape, simulate_cpu_devices
    _, width = mesh_shape(cfg.mesh, args.num_devices)
    from mecefo_jax.experiments import memory_plan
    simulate_cpu_devices(memory_plan.REPLICAS * width)
    memory_plan.main(cfg, args.out, num_devices=args.num_devices, limit_gb=args.limit_gb,
                     failure_step=args.failure_step)


if __name__ == '__main__':
    main()
