"""Compile time of a new topology's train step against depth: see mecefo_jax/experiments/compile_time.py.

  python scripts/bench_compile.py --config configs/small.py --depths 2,24 --out /tmp/compile
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None):
    from mecefo_jax import cli
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--config', required=True, help='Path to a configs/*.py file.')
    parser.add_argument('--depths', default='2,24', help='Comma-separated layer counts.')
    parser.add_argument('--out', default=None, help='Directory for bench_compile.json.')
    args, cfg = cli.parse(parser, argv)
    depths = [int(d) for d in args.depths.split(',')]
    from mecefo_jax.sharding import simulate_cpu_devices
    simulate_cpu_devices(int(cfg.mesh.num_cpu_devices))
    from mecefo_jax.experiments import compile_time as bench_compile
    result = bench_compile.run(cfg, depths, args.out)
    for row in result['rows']:
        print(f"scan_layers={row['scan_layers']!s:5} layers={row['num_layers']:3d} "
              f"compile {row['compile_sec']:7.2f} s  x{row['ratio_to_shallowest']:.2f}")


if __name__ == '__main__':
    main()
