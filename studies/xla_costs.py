"""What XLA says a compiled program costs: its FLOPs, its memory plan, its loops.

`flops_of` is XLA's own cost analysis, which counts a while loop's body once
whatever its trip count: a step with scanned layers or a chunked loss reads
low by about the depth, and on a GPU, where the dots have become cuBLAS and
cuDNN custom calls, it misses most of them too. It is right only for
straight-line programs (`count_while_loops(...) == 0`) on a CPU.

`matmul_flops` counts what the optimized program multiplies, from its HLO
text: every `dot` (Triton's GEMM fusions included), every cuBLAS GEMM custom
call (2 x output elements x contracted size) and every cuDNN fused attention
(4 B N T S H forward, 8 B N T S H backward: the model's matmuls, not the
kernel's recomputation), each computation weighted by the times it runs: a
while body by its `known_trip_count`, a conditional by its dearest branch.
Remat recomputation is counted (it is executed), so over the analytic count
it reads as hardware over model FLOPs.
"""
from __future__ import annotations

import json
import math
import re

_HEADER = re.compile(r'^(?:ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*)?\{\s*$')
_INSTRUCTION = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$')
_ARRAY = re.compile(r'([a-z]+\d*)\[([\d,]*)\]')
_OPCODE = re.compile(r'\s*([\w\-]+)\(')
_CALLEE = re.compile(r'\b(calls|to_apply|body|true_computation|false_computation)=%?([\w.\-]+)')
_BRANCHES = re.compile(r'branch_computations=\{([^}]*)\}')
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
# A custom call into one of these that is no GEMM or attention is reported, not counted.
_MULTIPLYING_LIBRARIES = ('cublas', 'cudnn', 'gemm', 'matmul', 'conv', 'onednn', 'triton')
MEMORY_FIELDS = ('temp_size_in_bytes', 'argument_size_in_bytes', 'output_size_in_bytes',
                 'alias_size_in_bytes', 'generated_code_size_in_bytes', 'peak_memory_in_bytes')


def flops_of(compiled) -> float:
    """XLA's cost-analysis FLOPs (a dict, a list of dicts or None); loop bodies counted once."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else None
    return float(analysis.get('flops', float('nan'))) if analysis else float('nan')


def memory_of(compiled) -> dict[str, int]:
    """`memory_analysis()` byte counts plus `peak_bytes` (args + out + temp - alias)."""
    stats = compiled.memory_analysis()
    if stats is None:
        return {**{f: -1 for f in MEMORY_FIELDS}, 'peak_bytes': -1}
    mem = {f: int(getattr(stats, f, -1)) for f in MEMORY_FIELDS}
    mem['peak_bytes'] = (mem['argument_size_in_bytes'] + mem['output_size_in_bytes']
                         + mem['temp_size_in_bytes'] - mem['alias_size_in_bytes'])
    return mem


def count_while_loops(compiled) -> int:
    """While loops in the compiled HLO (XLA's cost analysis counts a loop body once)."""
    return (compiled.as_text() or '').count(' while(')


def _dims(type_text: str) -> list[int]:
    """The dimensions of an HLO type's first array (`bf16[16,256]{1,0}`, or a tuple's first)."""
    match = _ARRAY.search(type_text)
    return [int(d) for d in match.group(2).split(',') if d] if match else []


def _split_type(rest: str) -> tuple[str, str]:
    """(result type, the text after it) of an instruction's right-hand side."""
    if not rest.startswith('('):
        head, _, tail = rest.partition(' ')
        return head, tail
    depth = 0
    for i, char in enumerate(rest):
        depth += {'(': 1, ')': -1}.get(char, 0)
        if depth == 0:
            return rest[:i + 1], rest[i + 1:]
    return rest, ''


def _operands(call: str) -> list[str]:
    """Operand names of `opcode(...)`: the last token of each (a type may precede it)."""
    depth, start, names = 0, call.find('(') + 1, []
    for i in range(start, len(call)):
        depth += {'(': 1, '{': 1, '[': 1, ')': -1, '}': -1, ']': -1}.get(call[i], 0)
        if depth < 0 or (depth == 0 and call[i] == ','):
            if call[start:i].strip():
                names.append(call[start:i].split()[-1].lstrip('%'))
            if depth < 0:
                break
            start = i + 1
    return names


def _attribute_dims(text: str, key: str) -> list[int]:
    match = re.search(rf'{key}=\{{([\d,]*)\}}', text)
    return [int(d) for d in match.group(1).split(',') if d] if match else []


def _backend_config(text: str) -> dict:
    start = text.find('backend_config=')
    try:
        return json.JSONDecoder().raw_decode(text[start + len('backend_config='):])[0] if start >= 0 else {}
    except ValueError:
        return {}


def _find(tree, key):
    """The first value under `key` anywhere in a nested JSON object."""
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        tree = list(tree.values())
    for item in tree if isinstance(tree, list) else ():
        found = _find(item, key)
        if found is not None:
            return found
    return None


def _own_flops(opcode: str, out: list[int], call: str, shapes: dict) -> tuple[str, float] | None:
    """(kind, FLOPs) of one instruction that multiplies; None for any other."""
    operands = _operands(call)
    lhs = shapes.get(operands[0], []) if operands else []
    if opcode == 'dot':
        contracted = [lhs[d] for d in _attribute_dims(call, 'lhs_contracting_dims') if d < len(lhs)]
        return 'dot', 2.0 * math.prod(out) * math.prod(contracted)
    target = _TARGET.search(call)
    if opcode != 'custom-call' or target is None:
        return None
    name, config = target.group(1), _backend_config(call)
    if 'gemm' in name or 'matmul' in name:
        numbers = _find(config, 'dot_dimension_numbers') or {}
        contracted = [lhs[int(d)] for d in numbers.get('lhs_contracting_dimensions', []) if int(d) < len(lhs)]
        return 'gemm', 2.0 * math.prod(out) * math.prod(contracted)
    if 'fmha' in name:
        bnts = [int(d) for d in (_find(config, 'intermediate_tensor_shape') or {}).get('dimensions', [])]
        per_matmul = 2.0 * math.prod(bnts) * (lhs[-1] if lhs else 0)
        return 'attention', per_matmul * (4 if 'Backward' in name else 2)
    may_multiply = any(word in name.lower() for word in _MULTIPLYING_LIBRARIES)
    return ('uncounted:' + name, 0.0) if may_multiply else None


def instructions(hlo_text: str):
    """(computation, name, opcode, result dims, the text from the opcode on, whether the
    computation is the entry) of every instruction of an HLO module's text."""
    current, entry = None, False
    for line in hlo_text.splitlines():
        header = _HEADER.match(line)
        if header and not line.startswith(' '):
            current, entry = header.group(1), line.startswith('ENTRY')
            continue
        match = _INSTRUCTION.match(line) if current else None
        if match is None:
            continue
        name, rest = match.groups()
        type_text, call = _split_type(rest)
        opcode = _OPCODE.match(call)
        if opcode is not None:
            yield current, name, opcode.group(1), _dims(type_text), call, entry


def callees(call: str) -> list[tuple[str, str]]:
    """(attribute, computation) of every computation an instruction calls."""
    found = _CALLEE.findall(call)
    branches = _BRANCHES.search(call)
    if branches:
        found += [('branch', b.strip().lstrip('%')) for b in branches.group(1).split(',')]
    return found


def _parse(text: str) -> tuple[dict, str]:
    """{computation: [(kind, flops) | ('call', callee, times) | ('branches', [names])]}, entry."""
    computations, entry, shapes = {}, None, {}
    for computation, name, opcode, out, call, is_entry in instructions(text):
        if computation not in computations:
            computations[computation], shapes = [], {}
            entry = computation if is_entry else entry
        shapes[name] = out
        items = computations[computation]
        own = _own_flops(opcode, out, call, shapes)
        if own is not None:
            items.append(own)
        trip = _TRIP.search(call)
        branches = [callee for key, callee in callees(call) if key == 'branch']
        for key, callee in callees(call):
            if key != 'branch':
                times = (int(trip.group(1)) if trip else None) if key == 'body' else 1
                items.append(('call', callee, times))
        if branches:
            items.append(('branches', branches))
    return computations, entry


def matmul_flops(hlo_text: str) -> dict:
    """The optimized program's matmul FLOPs (module docstring): `flops`, `by_kind`,
    `unknown_trip_counts` (while loops counted once: no known trip count) and
    `uncounted` (custom calls that may multiply but are not counted)."""
    computations, entry = _parse(hlo_text)
    memo, unknown, uncounted = {}, [0], set()

    def total(name: str) -> dict:
        if name not in memo:
            memo[name] = {}  # a cycle (none in valid HLO) counts nothing
            kinds: dict = {}
            for item in computations.get(name, []):
                if item[0] == 'call':
                    unknown[0] += item[2] is None
                    parts = {k: v * (item[2] or 1) for k, v in total(item[1]).items()}
                elif item[0] == 'branches':
                    parts = max((total(b) for b in item[1]), key=lambda d: sum(d.values()), default={})
                else:
                    if item[0].startswith('uncounted:'):
                        uncounted.add(item[0].split(':', 1)[1])
                    parts = {item[0]: item[1]} if item[1] else {}
                for kind, flops in parts.items():
                    kinds[kind] = kinds.get(kind, 0.0) + flops
            memo[name] = kinds
        return memo[name]

    by_kind = total(entry) if entry else {}
    return {'flops': sum(by_kind.values()), 'by_kind': by_kind, 'unknown_trip_counts': unknown[0],
            'uncounted': sorted(uncounted)}
