"""The local Ray cluster of a launcher run without `--address` (`python -m mecefo_jax.launch.ray_host`).

A cluster the launcher started itself would die with it (Ray reaps a dead driver's
cluster), and the keepers' memory with it. This process holds the one-node cluster until
told to stop (SIGTERM, SIGINT), writing its address and pid to `--state_file` once up.
"""
import os

os.environ.setdefault('RAY_AUTH_MODE', 'token')  # read when ray is imported

import argparse  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from mecefo_jax.host import files  # noqa: E402

# A node whose raylet stops answering is declared dead after about
# period x threshold (Ray's defaults take 15 s or more): the launcher must
# see a lost node within a few seconds. Ray starts its workers at niceness 15
# by default; here they are the job (training and the keepers' memory), so
# they run at 0: on a loaded host a niced worker starves for seconds, and its
# silence then reads as a hang (launch.heartbeat_timeout_sec).
SYSTEM_CONFIG = {'health_check_initial_delay_ms': 0, 'health_check_period_ms': 500,
                 'health_check_timeout_ms': 500, 'health_check_failure_threshold': 3,
                 'worker_niceness': 0}


def _parse(argv):
    p = argparse.ArgumentParser(prog='python -m mecefo_jax.launch.ray_host', description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--state_file', required=True, help='where the address and pid are written')
    p.add_argument('--object_store_mb', type=int, default=256,
                   help="Ray's object store: small, so /dev/shm keeps room for the keepers")
    p.add_argument('--num_cpus', type=int, default=os.cpu_count() or 1)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = _parse(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    import ray
    start = time.perf_counter()
    # 'local': a new cluster, never one that some other program started on this machine.
    context = ray.init(address='local', num_cpus=args.num_cpus,
                       object_store_memory=args.object_store_mb << 20,
                       include_dashboard=False, log_to_driver=False, logging_level='WARNING',
                       _system_config=SYSTEM_CONFIG)
    files.write_json(args.state_file, {
        'address': context.address_info['gcs_address'], 'pid': os.getpid(),
        'start_sec': time.perf_counter() - start,
        'session_dir': context.address_info.get('session_dir')}, indent=None)
    print(f'[ray host] cluster at {context.address_info["gcs_address"]} '
          f'({time.perf_counter() - start:.1f} s)', flush=True)
    try:
        stop.wait()
    finally:
        ray.shutdown()
        try:
            os.unlink(args.state_file)
        except FileNotFoundError:
            pass
    return 0


if __name__ == '__main__':
    sys.exit(main())
