"""`run`: the one way to train, fault-free or under failures, from a resolved config.

The command line (`main.py`), the launcher's workers and every study call it.
It picks the controller from the config (fault-free data parallelism, the
fault controller for `fault.strategy`, or checkpoint/restart) and hands the
loop the caller's observers.
"""


def run(cfg, workdir: str, *, run=None, observers=(), stop_at=None, restore=None,
        elastic: bool = False, preemption=None) -> dict:
    """Train under the configured failures, or fault-free when none are.

    The fault controller for `fault.strategy` runs when a failure is configured, a replica
    is absent, or the run is `elastic` (a launcher's worker: its processes then agree on
    the live mask before every step); otherwise fault-free data parallelism. `run` is a
    prebuilt `Run` (default: from `cfg`); the rest goes to `training.loop.train`.
    """
    from mecefo_jax.failure_schedule import failures_requested
    from mecefo_jax.faults.strategies import strategy_spec
    from mecefo_jax.training import loop as train_lib
    from mecefo_jax.training import run_setup
    from mecefo_jax.training.controller import StaticController
    failures = failures_requested(cfg.fault)
    built = run or run_setup.build_run(cfg, workdir)
    if not failures and not elastic and all(built.present):
        controller = StaticController(built)
    elif strategy_spec(cfg.fault.strategy).restores_at_failure:
        from mecefo_jax.faults.controller import RestartController
        controller = RestartController.from_config(cfg, built)
    else:
        from mecefo_jax.faults.controller import FaultController
        controller = FaultController.from_config(cfg, built)
    return train_lib.train(cfg, workdir, controller=controller, run=built, observers=observers,
                           stop_at=stop_at, restore=restore, preemption=preemption)
