"""The report's model configs: a `configs/*.py` file (or its GPU variant, `llama_350m:gpu`)
with the few fields a section sets; nothing else of the training setup matters to a measurement.
"""
import importlib.util
import os

# The config fields a sweep cell sets, by the sweep's name for each (studies/gpu/sweep.py).
KNOB_FIELDS = {'attention': 'model.attention', 'remat_policy': 'model.remat_policy',
               'scan_layers': 'model.scan_layers', 'flat_optimizer': 'train.flat_optimizer'}
KNOBS = tuple(KNOB_FIELDS)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(name: str, overrides: dict | None = None):
    """The resolved config of configs/NAME.py (NAME:VARIANT passes VARIANT to its
    `get_config`, as `--config configs/NAME.py:VARIANT` does) with `overrides` set."""
    name, _, variant = name.partition(':')
    path = os.path.join(REPO, 'configs', f'{name}.py')
    spec = importlib.util.spec_from_file_location(f'_gpu_report_config_{name}', path)
    spec.loader.exec_module(module := importlib.util.module_from_spec(spec))
    cfg = module.get_config(variant) if variant else module.get_config()
    for dotted, value in (overrides or {}).items():
        section, field = dotted.split('.')
        if field not in (node := getattr(cfg, section)):
            raise ValueError(f'gpu report: config {name} has no field {dotted}.')
        setattr(node, field, value)
    from mecefo_jax.config.resolve import resolve
    return resolve(cfg)
