"""Simulated failures inside one running job, and the strategies that answer them.

`schedule` says which replicas are down at which step (`step_clock`: on the wall clock),
`strategies` and `planner` where their rows go (`costs`: what each role pays),
`controller` moves training between meshes as
replicas fail and recover, and `restart` is the checkpoint/restart baseline. Real failures
are the launcher's (`mecefo_jax.launch`)."""
