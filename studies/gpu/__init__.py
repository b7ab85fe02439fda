"""The GPU report (`scripts/gpu_report.py`, docs/gpu.md): every GPU figure in one command.

| module | owns |
|---|---|
| `report` | the sections in order, their weights, gpu_report.json and .md |
| `runner` | a child process per section, time limits shared out of the budget |
| `child` | the section process: call the section, write its status and figures |
| `configs` | the configs/*.py files the sections measure, with their overrides |
| `environment`, `step`, `attention`, `refresh`, `snapshot`, `compile` | the sections |
| `tables` | the markdown table of each section |
"""
