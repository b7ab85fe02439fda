"""The compile-ahead processes' command line: the driver, or (with --lost) one member.

`python -m mecefo_jax.launch.compile_ahead_job --config CFG --workdir DIR --workers N`
(or `--config_json`, the launcher's resolved config) compiles ahead for every
single-worker loss (see `compile_ahead`). Flags live here, apart from the library, so that
importing the launcher defines none.
"""
import os
import sys

from absl import app, flags
from ml_collections import config_flags

from mecefo_jax.launch import compile_ahead

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A configs/*.py file.', lock_config=True)
_CONFIG_JSON = flags.DEFINE_string('config_json', None, 'Or: a resolved config (launch/config.json).')
_WORKDIR = flags.DEFINE_string('workdir', None, 'The job directory.')
_WORKERS = flags.DEFINE_integer('workers', None, 'Workers of the full job.')
_LOSSES = flags.DEFINE_list('losses', None, 'Driver: only these lost workers (default: all).')
_NICE = flags.DEFINE_integer('nice', 19, 'Driver: niceness added (19: lowest priority; a '
                             'benchmark timing cold compiles passes 0).')
_LOST = flags.DEFINE_integer('lost', None, 'Member mode: the worker whose loss is compiled for.')
_COORDINATOR = flags.DEFINE_string('coordinator', None, 'Member mode: jax.distributed coordinator.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'Member mode: this process.')
flags.mark_flags_as_required(['workdir', 'workers'])


def main(argv):
    del argv
    compile_ahead.die_with_parent()  # before the config and jax load: the parent may go meanwhile
    from mecefo_jax.settings import load_json, resolve_or_exit
    if (_CONFIG.value is None) == (_CONFIG_JSON.value is None):
        sys.exit('compile_ahead_job: pass exactly one of --config and --config_json.')
    cfg = resolve_or_exit(_CONFIG.value) if _CONFIG_JSON.value is None else load_json(
        _CONFIG_JSON.value)
    if _LOST.value is None:
        losses = None if _LOSSES.value is None else [int(w) for w in _LOSSES.value]
        compile_ahead.drive(cfg, _config_args(), os.path.abspath(_WORKDIR.value),
                            _WORKERS.value, losses, _NICE.value)
    else:
        compile_ahead.compile_for_survivors(cfg, _WORKDIR.value, _WORKERS.value, _LOST.value,
                                            _COORDINATOR.value, _PROCESS_ID.value)


def _config_args() -> list[str]:
    """The driver's --config flags, passed on to its members unchanged."""
    return [a for a in sys.argv[1:] if a.startswith('--config')]


if __name__ == '__main__':
    sys.exit(app.run(main))
