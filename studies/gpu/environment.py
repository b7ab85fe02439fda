"""Report section `environment`: devices, memory and the software the figures came from."""
from __future__ import annotations

import importlib.metadata
import os
import platform

# Version getters of the CUDA plugin's `_versions` module (jax._src.lib.cuda_versions).
CUDA_GETTERS = ('cuda_runtime_get_version', 'cuda_driver_get_version', 'cudnn_get_version',
                'cublas_get_version', 'cusolver_get_version', 'cufft_get_version')
PACKAGES = ('jax', 'jaxlib', 'jax-cuda12-plugin', 'jax-cuda12-pjrt', 'jax-cuda13-plugin',
            'flax', 'optax', 'orbax-checkpoint', 'numpy', 'absl-py', 'ml_collections',
            'sentencepiece')


def package_versions() -> dict:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def cuda_versions() -> dict:
    """CUDA, cuDNN and library versions as the CUDA plugin reports them (none on CPU)."""
    from jax._src import lib
    module = getattr(lib, 'cuda_versions', None)
    if module is None:
        return {}
    out = {}
    for getter in CUDA_GETTERS:
        fn = getattr(module, getter, None)
        if fn is not None:
            try:
                out[getter.replace('_get_version', '')] = fn()
            except Exception as error:  # noqa: BLE001  (no driver: say so, go on)
                out[getter.replace('_get_version', '')] = f'unavailable: {error}'
    return out


def run(ctx) -> dict:
    import jax
    devices = jax.devices()
    first = devices[0]
    stats = first.memory_stats() or {}
    ctx.log(f'{len(devices)} x {first.platform}:{first.device_kind}')
    host_bytes = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
    return {
        'platform': first.platform, 'device_kind': first.device_kind,
        'device_count': len(devices), 'process_count': jax.process_count(),
        'device_memory_bytes': stats.get('bytes_limit'),
        'device_memory_note': ('memory_stats()["bytes_limit"]: what the allocator may use '
                               '(XLA_PYTHON_CLIENT_MEM_FRACTION of the device)'
                               if stats else 'no memory_stats() on this backend'),
        'host_memory_bytes': host_bytes, 'cpu_count': os.cpu_count(),
        'python': platform.python_version(), 'packages': package_versions(),
        'cuda': cuda_versions(),
        'xla_flags': os.environ.get('XLA_FLAGS', ''),
        'environment_info': jax.print_environment_info(return_string=True),
    }
