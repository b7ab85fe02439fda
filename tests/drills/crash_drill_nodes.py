"""The crash drill's jobs that need a cluster's owner or a launcher of their own.

* `node_loss`: on a simulated cluster of 2 nodes or more, the node of one
  worker is lost whole (worker, keeper and their shared memory) right after
  a snapshot every keeper holds, and a replacement node joins; the
  survivors go on from their own keepers and the worker rejoins on a live
  node, healing from its peers.
* `launcher_restart`: the launcher, a process of its own as a user runs it,
  kills itself right after a snapshot every keeper holds; its workers die
  with it, its keepers do not. The same command again finds the keepers and
  resumes from their memory.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from mecefo_jax.config.resolve import updated

_CONFIG_PY = '''"""The drill's resolved config, as a config file for the launcher's command line."""
import json

import ml_collections


def get_config():
    return ml_collections.ConfigDict(json.loads({text!r}))
'''


def node_loss_victim(nodes: int) -> int | None:
    """The worker whose node the drill loses: not the head's (losing it ends the cluster).

    The launcher places worker w on the (w mod nodes)-th node, the head last.
    """
    if nodes < 2:
        return None
    return 1 if 1 % nodes != nodes - 1 else 0


def node_loss_job(run_job, cfg, base: dict, out_dir: str, workers: int, *, cluster, victim: int,
                  kill_step: int, return_after: int, log) -> dict:
    """Lose `victim`'s node at its first snapshot at or after `kill_step`; a replacement joins."""
    values = dict(base, **{'launch.kill': f'{kill_step}:{victim}:node:snapshot',
                           'launch.return_after_steps': return_after,
                           'launch.compile_ahead': False})
    return run_job(cfg, values, os.path.join(out_dir, 'node_loss'), workers, log,
                   node_killer=lambda node: cluster.lose(node, replace=True))


def launcher_restart_job(cfg, base: dict, out_dir: str, workers: int, *, address: str,
                         kill_step: int, log) -> dict:
    """Kill the launcher after a snapshot every keeper holds; run the same command again.

    Returns the rerun's summary (its `launcher_restart` row is the recovery).
    """
    workdir = os.path.join(out_dir, 'launcher_restart')
    os.makedirs(workdir, exist_ok=True)
    config_py = os.path.join(workdir, 'drill_config.py')
    with open(config_py, 'w') as f:
        f.write(_CONFIG_PY.format(text=updated(cfg, dict(base, **{
            'launch.compile_ahead': False})).to_json()))
    command = [sys.executable, '-m', 'mecefo_jax.launch', f'--nprocs={workers}',
               f'--workdir={workdir}', f'--config={config_py}', f'--address={address}']
    kill = f'--config.launch.kill={kill_step}:launcher:KILL:snapshot'
    log(f'[drill] launcher_restart: {workers} workers, launch.kill={kill_step}:launcher:KILL:snapshot')
    first = subprocess.run(command + [kill], capture_output=True, text=True)
    if first.returncode != -signal.SIGKILL:
        raise RuntimeError(f'the launcher was to kill itself, but exited {first.returncode}:\n'
                           f'{first.stdout[-3000:]}{first.stderr[-3000:]}')
    log('[drill] launcher_restart: the launcher is dead; running the same command again')
    again = subprocess.run(command, capture_output=True, text=True)
    if again.returncode != 0:
        raise RuntimeError(f'the rerun failed ({again.returncode}):\n{again.stderr[-3000:]}')
    with open(os.path.join(workdir, 'launch', 'summary.json')) as f:
        return json.load(f)
