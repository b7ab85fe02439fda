"""Simulated failures and the strategies that answer them, inside one running job.

Which data-parallel replicas are down at which step, and where their rows go.
Real failures (processes killed, nodes lost) are the launcher's:
`mecefo_jax.launch` survives them, and `launch/kills.py` injects them.

`schedule` turns the `fault` config (an explicit event list, a paper regime or a
custom MTBF/MTTR process) into a validated, host-identical list of failure
events and answers per-step liveness queries for the training controller.
`strategies` lays the global batch onto the live replicas; `controller`
moves training between meshes as replicas fail and recover, and `restart`
is the checkpoint/restart baseline, which relaunches from disk instead.
"""
