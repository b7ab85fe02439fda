"""Report section `environment`: devices, memory and the software the figures came from."""
import importlib.metadata
import os
import platform

# Version getters of the CUDA plugin's `_versions` module (jax._src.lib.cuda_versions).
CUDA_GETTERS = ('cuda_runtime', 'cuda_driver', 'cudnn', 'cublas', 'cusolver', 'cufft')
PACKAGES = ('jax', 'jaxlib', 'jax-cuda12-plugin', 'jax-cuda12-pjrt', 'jax-cuda13-plugin',
            'flax', 'optax', 'orbax-checkpoint', 'numpy', 'absl-py', 'ml-collections',
            'sentencepiece')


def cuda_versions() -> dict:
    """CUDA, cuDNN and library versions as the CUDA plugin reports them (none on CPU)."""
    from jax._src import lib
    module, out = getattr(lib, 'cuda_versions', None), {}
    for name in CUDA_GETTERS if module is not None else ():
        try:
            out[name] = getattr(module, f'{name}_get_version')()
        except Exception as error:  # noqa: BLE001  (no driver, or no such getter: say so, go on)
            out[name] = f'unavailable: {error}'
    return out


def run(ctx) -> dict:
    import jax
    devices = jax.devices()
    ctx.log(f'{len(devices)} x {devices[0].platform}:{devices[0].device_kind}')
    return {'platform': devices[0].platform, 'device_kind': devices[0].device_kind,
            'device_count': len(devices), 'process_count': jax.process_count(),
            # what the allocator may use: XLA_PYTHON_CLIENT_MEM_FRACTION of the device
            'device_memory_bytes': (devices[0].memory_stats() or {}).get('bytes_limit'),
            'host_memory_bytes': os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'),
            'cpu_count': os.cpu_count(), 'python': platform.python_version(),
            'packages': {name: d.version for d in importlib.metadata.distributions()
                         if (name := d.metadata['Name'].lower().replace('_', '-')) in PACKAGES},
            'cuda': cuda_versions(), 'xla_flags': os.environ.get('XLA_FLAGS', ''),
            'environment_info': jax.print_environment_info(return_string=True)}
