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
