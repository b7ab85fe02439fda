"""The GPU report (`scripts/gpu_report.py`, docs/gpu.md): every GPU figure in one command.

| module | owns |
|---|---|
| `report` | the sections in order, their seconds, gpu_report.json and .md |
| `runner` | a child process per section, time limits out of the budget |
| `child` | the section process: call the section, write its status and figures |
| `configs` | the configs/*.py files the sections measure (or their GPU variant), with overrides |
| `programs` | one device's train step: build, compile (several at once), run; the MFU formula |
| `cells` | one sweep cell: a step at one batch and set of settings, timed |
| `environment`, `sweep`, `step`, `profile`, `attention`, `refresh`, `snapshot`, `compile` | the sections |
| `tables` | the markdown table of each section |
"""
