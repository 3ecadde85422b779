"""The compiled kernels of :mod:`lmlab.models.quantised` (numba; imported at the first product,
not with the models): ``out = x @ W.T`` where ``W``'s rows are stored as block codes interleaved
by groups of ``ROWS`` output rows, ``(row groups, blocks, codes per block, ROWS)``.

The work is weight-stationary: each vector of ``ROWS`` codes (one per output row of the group)
is dequantised once in registers (``d * q + m``) and multiplied with every row of a register
tile of up to ``TILE`` batch rows, one vector accumulator per row. The tile is written in LLVM
IR (a numba intrinsic) because numba's own loops keep such accumulators in memory.
"""

from __future__ import annotations

import functools

import numba
from llvmlite import binding, ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

BLOCK = 32  # weights per block (quantised.BLOCK)
ROWS = 16  # output rows interleaved per group, the vector lanes (quantised.ROWS)
# batch rows per register tile: its accumulators and a few more vectors live in registers,
# 32 of 16 lanes with AVX-512, 16 of 8 lanes (each vector two) with AVX2 only, where a tile
# of 8 spills (1.5x slower than 4, measured with numba compiling for AVX2 on a Zen 4)
TILE = 8 if "+avx512f" in (numba.config.CPU_FEATURES
                           or binding.get_host_cpu_features().flatten()) else 4


def _tile_codegen(tile: int, bits: int, half_scales: bool):
    """LLVM IR for rows ``b0 .. b0 + tile`` of ``x`` times row group ``t``'s codes."""
    f32, i32, per = ir.FloatType(), ir.IntType(32), BLOCK // 2 if bits == 4 else BLOCK
    vec, ints, raw_vec, halves, float16s = (ir.VectorType(t, ROWS) for t in (
        f32, i32, ir.IntType(8), ir.IntType(16), ir.HalfType()))

    def codegen(context, builder, sig, args):
        x, codes, scales, mins, out = (context.make_array(ty)(context, builder, value)
                                       for ty, value in zip(sig.args[:5], args[:5]))
        t, b0 = args[5:]
        width, n_out = (cgutils.unpack_tuple(builder, a.shape)[1] for a in (x, out))
        blocks = cgutils.unpack_tuple(builder, codes.shape)[1]
        idx = functools.partial(ir.Constant, width.type)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec] * 3),
                                             f"llvm.fma.v{ROWS}f32")

        def load(array, offset, ty=vec, align=4):  # ROWS values from array's flat offset
            return builder.load(builder.bitcast(builder.gep(array.data, [offset]),
                                                ty.as_pointer()), align=align)

        def scale(array, offset):  # float16 scales (their bits, uint16) widened to float32
            return builder.fpext(builder.bitcast(load(array, offset, halves, 2), float16s),
                                 vec) if half_scales else load(array, offset)

        def splat(value):  # a float32 in every lane
            one = builder.insert_element(ir.Constant(vec, ir.Undefined), value, i32(0))
            return builder.shuffle_vector(one, ir.Constant(vec, ir.Undefined), ints(None))

        rows = [builder.add(b0, idx(b)) for b in range(tile)]
        x_rows = [builder.gep(x.data, [builder.mul(row, width)]) for row in rows]
        accs = [cgutils.alloca_once_value(builder, ir.Constant(vec, None)) for _ in rows]
        with cgutils.for_range(builder, blocks) as block:
            group_block = builder.add(builder.mul(t, blocks), block.index)
            at = builder.mul(group_block, idx(ROWS))
            d, m = (scale(a, at) for a in (scales, mins)) if bits == 4 else (
                scale(scales, at), None)
            first_code = builder.mul(group_block, idx(per * ROWS))
            with cgutils.for_range(builder, idx(per)) as j:
                raw = load(codes, builder.add(first_code, builder.mul(j.index, idx(ROWS))),
                           raw_vec, 1)
                if bits == 4:  # low nibble: input j of the block, high: input j + 16
                    wide = builder.zext(raw, ints)
                    low = builder.uitofp(builder.and_(wide, ints([15] * ROWS)), vec)
                    high = builder.uitofp(builder.lshr(wide, ints([4] * ROWS)), vec)
                    weights = [(builder.call(fma, [d, low, m]), j.index),
                               (builder.call(fma, [d, high, m]), builder.add(j.index, idx(per)))]
                else:
                    weights = [(builder.fmul(d, builder.sitofp(raw, vec)), j.index)]
                for w, offset in weights:
                    column = builder.add(builder.mul(block.index, idx(BLOCK)), offset)
                    for x_row, acc in zip(x_rows, accs):
                        xs = splat(builder.load(builder.gep(x_row, [column])))
                        builder.store(builder.call(fma, [xs, w, builder.load(acc)]), acc)
        for row, acc in zip(rows, accs):
            at = builder.add(builder.mul(row, n_out), builder.mul(t, idx(ROWS)))
            builder.store(builder.load(acc), builder.bitcast(builder.gep(out.data, [at]),
                                                             vec.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


def _tile(tile: int):
    """The intrinsic ``(x, codes, scales, mins, out, t, b0)`` for ``tile`` batch rows; uint8
    codes are two 4-bit codes a byte with minima, int8 codes 8-bit ones (``mins`` unread);
    scales and minima float16 (as GGUF stores them; numba reads their bits as uint16) or
    float32."""
    def typer(typingctx, x, codes, scales, mins, out, t, b0):
        arrays = (x, codes, scales, mins, out)
        if not all(isinstance(a, types.Array) and a.layout == "C" for a in arrays) \
                or x.dtype != types.float32 or out.dtype != types.float32:
            return None  # the IR reads flat offsets of C-contiguous float32 rows
        bits = 4 if codes.dtype == types.uint8 else 8
        if bits == 4 and scales.dtype != mins.dtype:
            return None
        return (types.void(x, codes, scales, mins, out, types.intp, types.intp),
                _tile_codegen(tile, bits, scales.dtype == types.uint16))

    return intrinsic(typer)


_top, _four, _two, _one = (_tile(n) for n in (TILE, 4, 2, 1))


@njit(inline="always")
def _group(x, codes, scales, mins, out, t):  # pragma: no cover - compiled
    """Row group ``t`` for every row of ``x``, in tiles of TILE (8 or 4), 4, 2 and 1 rows."""
    batch, b0 = x.shape[0], 0
    while batch - b0 >= TILE:
        _top(x, codes, scales, mins, out, t, b0)
        b0 += TILE
    if batch - b0 >= 4:
        _four(x, codes, scales, mins, out, t, b0)
        b0 += 4
    if batch - b0 >= 2:
        _two(x, codes, scales, mins, out, t, b0)
        b0 += 2
    if batch - b0 == 1:
        _one(x, codes, scales, mins, out, t, b0)


@njit(cache=True)
def serial(x, codes, scales, mins, out):  # pragma: no cover - compiled
    """``out[:, :groups * ROWS] = x @ W.T`` on the calling thread (x, out: C-contiguous
    float32; codes (groups, blocks, 16 or 32, ROWS); scales, mins (groups, blocks, ROWS),
    float16 viewed as uint16, or float32)."""
    for t in range(codes.shape[0]):
        _group(x, codes, scales, mins, out, t)


@njit(parallel=True, cache=True)
def threaded(x, codes, scales, mins, out):  # pragma: no cover - compiled
    """:func:`serial` with the row groups shared among numba's threads."""
    for t in prange(codes.shape[0]):
        _group(x, codes, scales, mins, out, t)
