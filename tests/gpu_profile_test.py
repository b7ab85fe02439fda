"""studies/gpu/profile.py's table, from made-up trace events and HLO text (no jax).

On a GPU the step's kernels are device events naming their HLO op; the table
puts each in its place by that op's instruction, counts loops as containers
(not twice), and the idle time is the gaps between the first and last op.
"""
from studies.gpu import profile

HLO = """HloModule jit_train_step

%fused_dot (a: bf16[8,8], b: bf16[8,8]) -> bf16[8,8] {
  ROOT %d = bf16[8,8]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, \
metadata={op_name="jit(train_step)/jvp(Llama)/layers/ffn/w_up/dot_general"}
}

%fused_adam (m: f32[8]) -> f32[8] {
  ROOT %u = f32[8]{0} multiply(%m, %m), metadata={op_name="jit(train_step)/optimizer/mul"}
}

%body (p: f32[8]) -> f32[8] {
  ROOT %gemm_fusion.1 = bf16[8,8]{1,0} fusion(%x, %y), kind=kCustom, calls=%fused_dot
}

ENTRY %main (s: f32[8]) -> f32[8] {
  %while.1 = f32[8]{0} while(%s), condition=%cond, body=%body
  %fmha.1 = (bf16[2,8,4,8]{3,2,1,0}) custom-call(%q, %k, %v), \
custom_call_target="__cudnn$fmhaSoftmax"
  %loop_multiply_fusion = f32[8]{0} fusion(%s), kind=kLoop, calls=%fused_adam
  %copy.3 = f32[8]{0} copy(%s)
  ROOT %add.1 = f32[8]{0} add(%s, %s)
}
"""


def _event(op, ts, dur, process='/device:GPU:0', module='jit_train_step'):
    return {'name': op, 'ts': ts, 'dur': dur, 'process': process,
            'args': {'hlo_op': op, 'hlo_module': module}}


def test_device_ops_are_placed_by_their_instruction_and_gaps_are_idle():
    categories = profile.classify(HLO)
    assert categories['while.1'] is None  # a container: its body's ops are events of their own
    events = [_event('while.1', 0, 100), _event('gemm_fusion.1', 0, 40),
              _event('fmha.1', 40, 20), _event('loop_multiply_fusion', 70, 10),
              _event('copy.3', 80, 5), _event('add.1', 90, 10),
              _event('add.1', 0, 1000, process='/host:CPU'),  # the host's launch: not counted
              _event('other_module_op', 0, 50, module='jit_init')]
    table = profile.time_by_category(events, categories, 'jit_train_step', steps=1)
    assert table['source'] == 'device'
    assert table['categories'] == {'matmuls': 0.04, 'attention': 0.02, 'optimizer': 0.01,
                                   'elementwise': 0.01, 'copies': 0.005, 'other': 0.0}
    assert table['window_ms_per_step'] == 0.1
    assert abs(table['idle_ms_per_step'] - 0.015) < 1e-12  # 60-70 and 85-90 us
    assert table['top_ops'][0] == {'op': 'gemm_fusion.1', 'category': 'matmuls',
                                   'ms_per_step': 0.04}


def test_kernels_that_name_no_op_are_placed_by_their_names():
    events = [{'name': 'sm90_xmma_gemm_bf16', 'ts': 0, 'dur': 30, 'process': '/device:GPU:0'},
              {'name': 'cudnn_flash_fprop', 'ts': 30, 'dur': 10, 'process': '/device:GPU:0'},
              {'name': 'loop_add_fusion', 'ts': 40, 'dur': 10, 'process': '/device:GPU:0'}]
    table = profile.time_by_category(events, {}, 'jit_train_step', steps=2)
    assert table['source'].startswith('device kernels')
    assert table['categories']['matmuls'] == 0.015 and table['categories']['attention'] == 0.005
    assert table['categories']['elementwise'] == 0.005 and table['idle_ms_per_step'] == 0.0
