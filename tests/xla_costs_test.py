"""studies/xla_costs.py: one FLOP count that is right, and the MFU formula.

XLA's cost analysis counts a while loop's body once: a step with scanned
layers reads low. `matmul_flops` counts the optimized program's matmuls with
each loop body times its trip count; on a tiny model it equals the analytic
count (6 N + attention FLOPs per token) exactly, scanned or unrolled. The GPU
forms it reads (cuBLAS GEMM and cuDNN attention custom calls) are checked on
HLO text: cuDNN's as jax lowers it for CUDA, here on a CPU, and cuBLAS's as
XLA's GPU compiler writes it.
"""
import json

import jax
import jax.numpy as jnp
import pytest

from studies.gpu import configs
from studies.gpu.programs import PEAK_FLOPS, Setup, mfu
from studies.step_modes import model_flops_per_token
from studies.xla_costs import flops_of, matmul_flops

# A while loop of trip count 3 around a cuBLAS GEMM [64, 32] x [32, 16] (2 x 64 x 16 x 32
# FLOPs each), then a conditional whose dearer branch holds a dot [8, 4] x [4, 2], and a
# cuDNN convolution, which is reported as not counted.
GPU_HLO = """HloModule jit_step, entry_computation_layout={()->f32[]}

%body (p: (s32[], bf16[64,32])) -> (s32[], bf16[64,32]) {
  %p = (s32[], bf16[64,32]{1,0}) parameter(0)
  %x = bf16[64,32]{1,0} get-tuple-element(%p), index=1
  %w = bf16[32,16]{1,0} constant({...})
  %custom-call.3 = (bf16[64,16]{1,0}, s8[4194304]{0}) custom-call(bf16[64,32]{1,0} %x, \
bf16[32,16]{1,0} %w), custom_call_target="__cublas$gemm", backend_config=GEMM_CONFIG
  ROOT %t = (s32[], bf16[64,32]{1,0}) tuple(%i, %x)
}

%cond (p.1: (s32[], bf16[64,32])) -> pred[] {
  %p.1 = (s32[], bf16[64,32]{1,0}) parameter(0)
  ROOT %lt = pred[] compare(%a, %b), direction=LT
}

%cheap (q: f32[8,4]) -> f32[8,4] {
  ROOT %q = f32[8,4]{1,0} parameter(0)
}

%dear (r: f32[8,4]) -> f32[8,2] {
  %r = f32[8,4]{1,0} parameter(0)
  %k = f32[4,2]{1,0} constant({...})
  ROOT %dot.1 = f32[8,2]{1,0} dot(%r, %k), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: bf16[64,32]) -> f32[] {
  %a = bf16[64,32]{1,0} parameter(0)
  %while.1 = (s32[], bf16[64,32]{1,0}) while(%init), condition=%cond, body=%body, \
backend_config={"known_trip_count":{"n":"3"}}
  %conditional.2 = f32[8,2]{1,0} conditional(%pred, %m, %m), branch_computations={%cheap, %dear}
  %conv = (f32[1,8,8,4]{3,2,1,0}, u8[0]{0}) custom-call(%img, %ker), \
custom_call_target="__cudnn$convForward"
  ROOT %out = f32[] constant(0)
}
""".replace('GEMM_CONFIG', json.dumps({
    'operation_queue_id': '0', 'gemm_backend_config': {
        'alpha_real': 1, 'beta': 0, 'epilogue': 'DEFAULT', 'dot_dimension_numbers': {
            'lhs_contracting_dimensions': ['1'], 'rhs_contracting_dimensions': ['0'],
            'lhs_batch_dimensions': [], 'rhs_batch_dimensions': []}}}, separators=(',', ':')))


def test_gpu_gemms_loops_and_branches_are_counted():
    count = matmul_flops(GPU_HLO)
    gemm, dot = 3 * 2 * 64 * 16 * 32, 2 * 8 * 2 * 4
    assert count['by_kind'] == {'gemm': gemm, 'dot': dot}
    assert count['flops'] == gemm + dot
    assert count['uncounted'] == ['__cudnn$convForward'] and count['unknown_trip_counts'] == 0


def test_a_loop_without_a_known_trip_count_is_reported():
    count = matmul_flops(GPU_HLO.replace('backend_config={"known_trip_count":{"n":"3"}}', ''))
    assert count['by_kind']['gemm'] == 2 * 64 * 16 * 32 and count['unknown_trip_counts'] == 1


def test_cudnn_attention_counts_its_four_and_eight_matmuls(monkeypatch):
    """jax's cuDNN attention as lowered for CUDA (its version checks stubbed: no GPU here)."""
    from jax._src.cudnn import fused_attention_stablehlo as fused
    monkeypatch.setattr(fused, 'check_cudnn_version', lambda: 91900)
    monkeypatch.setattr(fused, 'check_compute_capability', lambda capability: True)
    monkeypatch.setattr(fused, 'is_cuda_compute_capability_equal', lambda capability: False)

    def loss(q, k, v):
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation='cudnn')
        return out.astype(jnp.float32).sum()
    b, t, n, h = 2, 128, 4, 64
    q = jax.ShapeDtypeStruct((b, t, n, h), jnp.bfloat16)
    lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, q, q).lower(
        lowering_platforms=('cuda',))
    count = matmul_flops(lowered.as_text(dialect='hlo'))
    assert count['by_kind'] == {'attention': (4 + 8) * b * n * t * t * h}


@pytest.fixture(scope='module')
def tiny_bf16():
    return configs.load('tiny', {'model.dtype': 'bfloat16', 'model.attention': 'xla'})


@pytest.mark.parametrize('scan', [True, False])
def test_the_count_of_a_step_is_the_analytic_count_scanned_or_unrolled(scan):
    setup = Setup.build(configs.load('tiny', {'model.dtype': 'bfloat16', 'model.attention': 'xla',
                                              'model.scan_layers': scan}))
    batch = 2
    compiled = setup.compile('normal', batch)
    tokens = batch * setup.cfg.data.seq_len
    analytic = model_flops_per_token(setup.cfg, setup.state_abs.params) * tokens
    count = matmul_flops(compiled.as_text())
    assert count['flops'] == pytest.approx(analytic, rel=1e-12)
    assert count['unknown_trip_counts'] == 0 and not count['uncounted']
    if scan:  # XLA's own count sees one block of the two (and no loss chunk loop but one)
        assert flops_of(compiled) < 0.9 * analytic


def test_mfu_is_six_n_plus_attention_over_the_peak(tiny_bf16):
    """A hand count of configs/tiny.py: d 32, 2 layers, 4 heads of 8, 2 KV heads, FFN 64,
    vocab 256, 32 tokens a sequence."""
    d, layers, kv, ffn, vocab, seq = 32, 2, 2 * 8, 64, 256, 32
    per_layer = d * d + 2 * d * kv + d * d + 3 * d * ffn  # wq, wk and wv, wo, SwiGLU
    n = layers * per_layer + d * vocab  # the head; not the embedding lookup, not the norms
    per_token = 6 * n + 12 * layers * d * seq
    params = Setup.build(tiny_bf16).state_abs.params
    tokens, step_sec = 2 * seq, 1e-3
    assert mfu(tiny_bf16, params, tokens, step_sec) == pytest.approx(
        per_token * tokens / step_sec / PEAK_FLOPS, rel=1e-12)
    assert PEAK_FLOPS == 989e12
