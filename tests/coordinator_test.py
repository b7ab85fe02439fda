"""The launcher's jax.distributed coordinator listens only on the address it was given."""
import ipaddress
import json
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.subprocess  # starts jax.distributed in a child process

# Prints the local addresses of the sockets listening on the coordinator's port,
# read from the kernel's tables (/proc/net/tcp{,6}: hex address:port, state 0A = LISTEN).
CHILD = """
import json, sys
port, bind = int(sys.argv[1]), sys.argv[2] == 'bind'
import jax
if bind:
    from mecefo_jax.launch.worker import join
    join(f'127.0.0.1:{port}', 1, 0)
else:  # JAX's default, for contrast
    jax.distributed.initialize(coordinator_address=f'127.0.0.1:{port}', num_processes=1,
                               process_id=0)
found = []
for table in ('/proc/net/tcp', '/proc/net/tcp6'):
    for line in open(table).readlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hexport = local.rsplit(':', 1)
        if state == '0A' and int(hexport, 16) == port:
            found.append(address)
print(json.dumps(found))
jax.distributed.shutdown()
"""


def _ip(hex_address: str) -> str:
    """A /proc/net address (32-bit little-endian words) as text; IPv4-mapped IPv6 as IPv4."""
    raw = bytes.fromhex(hex_address)
    ip = ipaddress.ip_address(b''.join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))
    return str(getattr(ip, 'ipv4_mapped', None) or ip)


def listening_addresses(bind: bool) -> set[str]:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    out = subprocess.run([sys.executable, '-c', CHILD, str(port), 'bind' if bind else 'default'],
                         capture_output=True, text=True, timeout=120,
                         env={'JAX_PLATFORMS': 'cpu', 'PATH': '/usr/bin:/bin'})
    assert out.returncode == 0, out.stderr[-2000:]
    return {_ip(a) for a in json.loads(out.stdout.strip().splitlines()[-1])}


def test_the_coordinator_binds_only_the_launchers_address():
    assert listening_addresses(bind=True) == {'127.0.0.1'}
    # JAX's default listens on every interface ([::]): what join() avoids.
    assert '::' in listening_addresses(bind=False)


# Joins a 2-process job, says so, and waits on stdin; then leaves Python
# without jax.distributed.shutdown, as a worker does when its run failed.
HELD = """
import sys
from mecefo_jax.launch.worker import join
join(f'127.0.0.1:{sys.argv[1]}', 2, int(sys.argv[2]))
print('joined', flush=True)
sys.stdin.readline()
"""


def test_a_process_leaving_after_its_peer_died_exits_at_once():
    # Without the exit hook, JAX's shutdown barrier waits for the dead peer
    # until the heartbeat timeout (100 s) aborts the process: SIGABRT, rc -6.
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    env = {'JAX_PLATFORMS': 'cpu', 'PATH': '/usr/bin:/bin'}
    procs = [subprocess.Popen([sys.executable, '-c', HELD, str(port), str(i)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for i in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == 'joined'
        procs[1].kill()
        procs[1].wait()
        procs[0].stdin.write('\n')
        procs[0].stdin.flush()
        assert procs[0].wait(timeout=60) == 0  # well inside the 100 s heartbeat timeout
    finally:
        for p in procs:
            p.kill()
            p.wait()
