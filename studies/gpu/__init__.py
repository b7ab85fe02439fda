"""The GPU report (`scripts/gpu_report.py`, docs/gpu.md): every GPU figure in one command.

| module | owns |
|---|---|
| `report` | the sections in order, gpu_report.json and .md, the one table writer |
| `runner` | a child process per section (the smoke: one process), limits out of the budget |
| `configs`, `programs` | the configs measured; one device's step built, compiled, timed; MFU |
| `sweep`, `step`, `environment`, `profile`, `attention`, `snapshot` | the sections |
"""
