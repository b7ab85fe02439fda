"""The launcher's heartbeat socket takes datagrams from anyone on the host: junk is counted, never fatal."""
import json
import socket
import time

from mecefo_jax.launch.heartbeat import MAX_BEAT_BYTES, HeartbeatMonitor


def beat(**fields):
    return json.dumps({'worker': 1, 'generation': 0, 'completed': 3, 'dispatched': 4,
                       **fields}).encode()


def test_junk_datagrams_are_rejected_and_counted_and_good_beats_still_land():
    monitor = HeartbeatMonitor(workers=2)
    junk = [b'not json', b'\xff\xfe', b'[1, 2]', b'{}', beat(worker='1'), beat(completed=True),
            beat(generation=-1), beat(worker=7), beat(completed=1.5),
            beat(pad='x' * MAX_BEAT_BYTES), b'x' * 60000]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for data in junk + [beat()]:
            sock.sendto(data, monitor.address)
        deadline = time.monotonic() + 5  # loopback datagrams arrive at once; bound the wait
        while monitor.rejected + len(monitor.latest) < len(junk) + 1:
            assert time.monotonic() < deadline, (monitor.rejected, monitor.latest)
            monitor.poll()
            time.sleep(0.01)
    monitor.close()
    assert monitor.rejected == len(junk)
    assert monitor.beat(0, 1)['completed'] == 3 and list(monitor.latest) == [(0, 1)]


def test_a_worker_whose_launcher_died_before_its_heartbeat_started_exits_orphaned():
    """The launcher's pid comes from the command line: a worker adopted before its
    heartbeat thread starts still sees that its launcher is gone (it exits 70 at once,
    instead of training on with nobody to tear it down)."""
    import subprocess
    import sys

    from mecefo_jax.launch.heartbeat import EXIT_ORPHANED
    gone = subprocess.Popen([sys.executable, '-c', 'pass'])
    gone.wait()  # a pid that is nobody's parent now
    code = ('import time; from mecefo_jax.launch.heartbeat import HeartbeatSender; '
            f'HeartbeatSender(("127.0.0.1", 9), 0, 0, launcher_pid={gone.pid}); time.sleep(60)')
    worker = subprocess.run([sys.executable, '-c', code], timeout=30)
    assert worker.returncode == EXIT_ORPHANED
