"""Host utilities that know nothing of models: files, locks, disk space, processes.

| module | what it owns |
|---|---|
| `files` | files a reader or a crash sees whole, old or new; JSON read back or None |
| `processes` | processes by pid (alive, command line, start time), this machine, daemon threads |
| `workdir_lock` | one run per workdir |
| `disk_space` | warning before a checkpoint cannot fit, explaining one that did not |
| `multihost` | every process of a job taking the same decision |
| `tree_paths` | the names of pytree key paths, the same everywhere |
"""
