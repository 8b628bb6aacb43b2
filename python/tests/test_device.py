"""Block tables and slot mappings as numpy arrays (device/block_table.hpp)."""

import math
import time

import numpy as np
import pytest

import pagedkv


def test_make_block_table():
    t = pagedkv.make_block_table([[3, 4, 5], np.array([7], dtype=np.int32), []])
    assert t.dtype == np.int32 and t.shape == (3, 3) and t.flags.c_contiguous
    assert t.tolist() == [[3, 4, 5], [7, 0, 0], [0, 0, 0]]
    assert pagedkv.make_block_table([[1]], max_blocks_per_seq=4, pad_block_id=9).tolist() == \
        [[1, 9, 9, 9]]
    t[0, 0] = 11   # owns its data: writable, independent of anything else
    assert t[0, 0] == 11
    with pytest.raises(pagedkv.Error):
        pagedkv.make_block_table([[1, 2, 3]], max_blocks_per_seq=2)
    with pytest.raises(pagedkv.Error):
        pagedkv.make_block_table([[-1]])


def test_slot_mapping_and_slot_of():
    s = pagedkv.slot_mapping([3, 8], 4, 2, 5)
    assert s.dtype == np.int64 and s.tolist() == [14, 15, 32, 33, 34]
    assert pagedkv.slot_of([3, 8], 4, 5) == 33
    with pytest.raises(pagedkv.Error) as e:
        pagedkv.slot_of([3, 8], 4, 8)
    assert e.value.code == pagedkv.ErrorCode.OUT_OF_RANGE
    assert pagedkv.SKIP_SLOT == -1


def test_validate_block_table():
    t = pagedkv.make_block_table([[1, 2], [3]])
    pagedkv.validate_block_table(t, [8, 3], 4, 4)
    with pytest.raises(pagedkv.Error):
        pagedkv.validate_block_table(t, [8, 3], 4, 3)      # block 3 outside a 3-block pool
    with pytest.raises(pagedkv.Error):
        pagedkv.validate_block_table(t, [9, 3], 4, 4)      # 9 tokens need a third column


def test_stubs_cover_the_module():
    """_pagedkv.pyi names every public class and function of the compiled module, and every
    public method of its classes, so editors complete what exists."""
    import ast
    import os

    import pagedkv._pagedkv as mod

    stub = os.path.join(os.path.dirname(pagedkv.__file__), "_pagedkv.pyi")
    tree = ast.parse(open(stub).read())
    names, members = set(), {}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            members[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)} | {
                n.target.id for n in node.body if isinstance(n, ast.AnnAssign)} | {
                t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets}
        if isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
    public = {n for n in dir(mod) if not n.startswith("_")}
    assert public - names == set()
    # ...and names nothing the module lacks (the publisher exists only with the events layer).
    optional = set() if mod.HAS_EVENTS else {"KVEventPublisher", "KVEventPublisherStats"}
    aliases = {"Tokens", "SchemeLike", "RequestLike", "KVEvent", "__version__"}
    assert names - public - optional - aliases == set()
    assert {"TieredKVCacheManager", "TierPlan", "KVEventPublisher"} <= names
    for cls, got in members.items():
        obj = getattr(mod, cls)
        if isinstance(obj, type) and not issubclass(obj, BaseException):
            want = {n for n in vars(obj) if not n.startswith("_")}
            if hasattr(obj, "__members__"):
                want -= set(obj.__members__) | {"name", "value"}
            assert want - got == set(), cls
    assert set(pagedkv.__all__) <= public | {"__version__"}


@pytest.mark.parametrize("call", [
    lambda: pagedkv.make_block_table([[1, 2.5]]),
    lambda: pagedkv.make_block_table([[True]]),
    lambda: pagedkv.slot_of([1.0], 4, 0),
    lambda: pagedkv.slot_of(np.array([True, False]), 4, 0),
    lambda: pagedkv.slot_mapping([1, True], 4, 0, 2),
    lambda: pagedkv.validate_block_table(np.array([[1.5, 2.0]]), [8], 4, 4),
    lambda: pagedkv.validate_block_table([[1.0, 2.0]], [8], 4, 4),
    lambda: pagedkv.validate_block_table(np.array([[True, True]]), [8], 4, 4),
    lambda: pagedkv.validate_block_table(np.array([[1, 2]], dtype=np.int32), [8.0], 4, 4),
    lambda: pagedkv.validate_block_table(np.array([[1, 2]], dtype=np.int32), [True], 4, 4),
], ids=["table float", "table bool", "slot_of float", "slot_of bool", "slot_mapping bool",
        "validate float array", "validate float list", "validate bool", "validate float lens",
        "validate bool lens"])
def test_block_ids_refuse_floats_and_bools(call):
    with pytest.raises(pagedkv.Error) as e:
        call()
    assert e.value.code == pagedkv.ErrorCode.INVALID_ARGUMENT, str(e.value)
    assert "expected integers" in str(e.value)


def test_integer_tables_of_any_integer_dtype_validate():
    for t in (np.array([[1, 2]], dtype=np.int64), [[1, 2]], np.array([[1, 2]], dtype=np.uint8),
              np.asfortranarray(np.array([[1, 2]], dtype=np.int32))):
        pagedkv.validate_block_table(t, [8], 4, 4)
    with pytest.raises(pagedkv.Error):
        pagedkv.validate_block_table(np.array([[1, 2**40]]), [8], 4, 4)  # does not fit int32


# ---- KV cache sizing and FP8 (docs/fp8.md) ----

def llama3_8b(dtype="bf16", scale_mode="none"):
    return pagedkv.KVCacheSpec(num_layers=32, num_kv_heads=8, head_dim=128, dtype=dtype,
                               scale_mode=scale_mode)


def test_kv_sizes_match_the_formulas_and_the_documented_figures():
    layers, heads, dim, bs = 32, 8, 128, 16
    budget = 40 * 2**30
    cases = [
        (llama3_8b(), 2 * layers * heads * dim * 2, None),
        (llama3_8b("fp8_e4m3", "per_tensor"), 2 * layers * heads * dim, None),
        (llama3_8b(pagedkv.KVDtype.FP8_E5M2, pagedkv.KVScaleMode.PER_TOKEN_HEAD),
         2 * layers * heads * (dim + 4),
         2 * layers * ((bs * heads * (dim + 4) + 15) // 16 * 16)),  # codes + scales, padded
    ]
    for spec, per_token, per_block in cases:
        per_block = per_block or per_token * bs
        assert pagedkv.kv_bytes_per_token(spec) == per_token, spec
        assert pagedkv.kv_bytes_per_block(spec, bs) == per_block, spec
        assert pagedkv.num_blocks_for_budget(spec, bs, budget) == budget // per_block, spec
    # The figures docs/fp8.md and bench/results/fp8.md quote.
    assert [pagedkv.kv_bytes_per_token(s) for s, _, _ in cases] == [131072, 65536, 67584]
    assert [pagedkv.kv_bytes_per_block(s, 16) for s, _, _ in cases] == \
        [2097152, 1048576, 1081344]
    assert [pagedkv.num_blocks_for_budget(s, 16, budget) for s, _, _ in cases] == \
        [20480, 40960, 39718]
    # A padded block: 3 tokens x 1 head x (8 + 4) = 36 bytes -> 48 per plane.
    tiny = pagedkv.KVCacheSpec(1, 1, 8, "fp8_e4m3", "per_token_head")
    assert pagedkv.kv_bytes_per_block(tiny, 3) == 2 * 48
    assert pagedkv.num_blocks_for_budget(tiny, 3, 95) == 0


def test_kv_cache_spec_fields_and_enums():
    s = llama3_8b("fp8_e4m3", "per_token_head")
    assert (s.num_layers, s.num_kv_heads, s.head_dim) == (32, 8, 128)
    assert s.dtype == pagedkv.KVDtype.FP8_E4M3 and s.dtype.dtype_name == "fp8_e4m3"
    assert s.scale_mode == pagedkv.KVScaleMode.PER_TOKEN_HEAD
    assert s.scale_mode.mode_name == "per_token_head"
    assert s == llama3_8b(pagedkv.KVDtype.FP8_E4M3, "per_token_head") and s != llama3_8b()
    assert "fp8_e4m3" in repr(s) and "per_token_head" in repr(s)
    # The numbers the tiers' value header stores.
    assert [int(d.value) for d in (pagedkv.KVDtype.FLOAT16, pagedkv.KVDtype.BFLOAT16,
                                   pagedkv.KVDtype.FP8_E4M3, pagedkv.KVDtype.FP8_E5M2)] == \
        [0, 1, 2, 3]
    assert [int(m.value) for m in (pagedkv.KVScaleMode.NONE, pagedkv.KVScaleMode.PER_TENSOR,
                                   pagedkv.KVScaleMode.PER_TOKEN_HEAD)] == [0, 1, 2]
    assert [d.bytes_per_value for d in (pagedkv.KVDtype.FLOAT16, pagedkv.KVDtype.FP8_E5M2)] == \
        [2, 1]
    assert pagedkv.KVDtype.FP8_E5M2.is_fp8 and not pagedkv.KVDtype.BFLOAT16.is_fp8
    assert llama3_8b().dtype == pagedkv.KVDtype.BFLOAT16


@pytest.mark.parametrize("call", [
    lambda: llama3_8b("fp8_e4m3"),                      # FP8 needs a scale mode
    lambda: llama3_8b("bf16", "per_tensor"),            # 16-bit takes none
    lambda: llama3_8b("fp8_e5m3", "per_tensor"),        # unknown dtype
    lambda: llama3_8b("fp8_e4m3", "per_row"),           # unknown mode
    lambda: llama3_8b(3, "none"),                       # not an enum or a name
    lambda: pagedkv.KVCacheSpec(0, 8, 128),
    lambda: pagedkv.KVCacheSpec(True, 8, 128),
    lambda: pagedkv.KVCacheSpec(32, 8.0, 128),
    lambda: pagedkv.KVCacheSpec(32, 8, 2**31),
    lambda: pagedkv.kv_bytes_per_block(llama3_8b(), 0),
    lambda: pagedkv.kv_bytes_per_block(llama3_8b(), True),
    lambda: pagedkv.kv_bytes_per_block(llama3_8b(), 16.0),
    lambda: pagedkv.num_blocks_for_budget(llama3_8b(), 16, -1),
    lambda: pagedkv.num_blocks_for_budget(llama3_8b(), 16, 1.5e9),
    lambda: pagedkv.num_blocks_for_budget(llama3_8b(), 16, np.bool_(True)),
    lambda: pagedkv.float_to_fp8_bits([1.0], "bf16"),   # not an FP8 dtype
    lambda: pagedkv.float_to_fp8_bits([1.0, True], "fp8_e4m3"),
    lambda: pagedkv.float_to_fp8_bits(np.array([True]), "fp8_e4m3"),
    lambda: pagedkv.float_to_fp8_bits(np.array(["1"]), "fp8_e4m3"),
    lambda: pagedkv.fp8_bits_to_float(np.array([1.0]), "fp8_e4m3"),
    lambda: pagedkv.fp8_bits_to_float([1, 2.0], "fp8_e4m3"),
    lambda: pagedkv.fp8_bits_to_float(np.array([True]), "fp8_e4m3"),
    lambda: pagedkv.fp8_bits_to_float([True], "fp8_e4m3"),
    lambda: pagedkv.fp8_bits_to_float([256], "fp8_e4m3"),
    lambda: pagedkv.fp8_bits_to_float(np.array([[-1]]), "fp8_e5m2"),
    lambda: pagedkv.quantize_fp8([1.0], "fp8_e4m3", 0.0),
    lambda: pagedkv.quantize_fp8([1.0], "fp8_e4m3", -1.0),
    lambda: pagedkv.quantize_fp8([1.0], "fp8_e4m3", float("nan")),
    lambda: pagedkv.quantize_fp8([1.0], "fp8_e4m3", float("inf")),
    lambda: pagedkv.quantize_fp8([1.0], "fp8_e4m3", True),
    lambda: pagedkv.dequantize_fp8([1], "fp8_e4m3", "1"),
    lambda: pagedkv.quantize_fp8_rows(np.float32(1.0), "fp8_e4m3"),
])
def test_kv_format_arguments_are_checked(call):
    with pytest.raises(pagedkv.Error) as e:
        call()
    assert e.value.code == pagedkv.ErrorCode.INVALID_ARGUMENT, str(e.value)


def fp8_value(code, fmt):
    """The value of one FP8 code, from the OCP format definition (independent of the library);
    NaN codes give a NaN of the code's sign, as fp8.hpp documents."""
    mbits, bias = (3, 7) if fmt == "fp8_e4m3" else (2, 15)
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code & 0x7f) >> mbits, code & ((1 << mbits) - 1)
    if fmt == "fp8_e4m3" and code & 0x7f == 0x7f:
        return math.copysign(float("nan"), sign)
    if fmt == "fp8_e5m2" and e == 31:
        return sign * float("inf") if m == 0 else math.copysign(float("nan"), sign)
    if e == 0:
        return sign * m * 2.0 ** (1 - bias - mbits)
    return sign * (1 + m / 2 ** mbits) * 2.0 ** (e - bias)


def reference_encode(x, fmt):
    """Round to nearest, ties to the even code, saturating, NaN -> 0x7f: by brute force over every
    non-negative finite code."""
    codes = np.array([c for c in range(128) if np.isfinite(fp8_value(c, fmt))])
    values = np.array([fp8_value(c, fmt) for c in codes])
    x = np.asarray(x, dtype=np.float32).astype(np.float64)
    out = np.zeros(x.shape, dtype=np.uint8)
    for i, v in enumerate(x):
        if np.isnan(v):
            out[i] = 0x7f
            continue
        a = min(abs(v), values.max())                  # saturate (inf too)
        d = np.abs(values - a)
        best = codes[d == d.min()]
        c = best[0] if len(best) == 1 else best[best % 2 == 0][0]
        out[i] = c | (0x80 if np.signbit(v) else 0)
    return out


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_decode_every_code(fmt):
    got = pagedkv.fp8_bits_to_float(np.arange(256, dtype=np.uint8), fmt)
    assert got.dtype == np.float32 and got.shape == (256,)
    want = np.array([fp8_value(c, fmt) for c in range(256)], dtype=np.float32)
    assert np.array_equal(got, want, equal_nan=True)
    assert np.array_equal(np.signbit(got), np.signbit(want))  # -0 is 0x80
    # Any integer dtype and shape; a list of ints.
    assert pagedkv.fp8_bits_to_float(np.array([[0x38, 0xb8]], dtype=np.int64), fmt).shape == (1, 2)
    assert pagedkv.fp8_bits_to_float([0x38], fmt)[0] == (1.0 if fmt == "fp8_e4m3" else 0.5)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_encode_matches_a_brute_force_reference(fmt):
    rng = np.random.default_rng(36)
    mbits, bias, top = (3, 7, 448.0) if fmt == "fp8_e4m3" else (2, 15, 57344.0)
    sub = 2.0 ** (1 - bias - mbits)
    special = [0.0, -0.0, sub, -sub, sub / 2, sub * 1.5, sub * 2.5, sub / 2 * 1.0000001,
               2.0 ** (1 - bias), top, -top, top * 1.03, top * 1.1, 1e38, np.inf, -np.inf, np.nan,
               -np.nan, 1.0, 1.0 + 2.0 ** -(mbits + 1), 1.0 + 3 * 2.0 ** -(mbits + 1),
               np.float32(1e-45)]
    # Every float32 between adjacent codes' midpoints, and random magnitudes over the range.
    finite = np.array([fp8_value(c, fmt) for c in range(128) if np.isfinite(fp8_value(c, fmt))])
    mids = (finite[1:] + finite[:-1]) / 2
    rand = (rng.choice([-1, 1], 3000) *
            2.0 ** rng.uniform(-bias - mbits - 3, np.log2(top) + 2, 3000))
    x = np.concatenate([special, mids, np.nextafter(mids.astype(np.float32), np.float32(0)),
                        np.nextafter(mids.astype(np.float32), np.float32(np.inf)),
                        finite, rand]).astype(np.float32)
    got = pagedkv.float_to_fp8_bits(x, fmt)
    assert got.dtype == np.uint8 and got.shape == x.shape
    want = reference_encode(x, fmt)
    bad = np.nonzero(got != want)[0]
    assert len(bad) == 0, [(float(x[i]), hex(got[i]), hex(want[i])) for i in bad[:5]]


def test_fp8_known_codes():
    e4 = lambda v: [hex(c) for c in pagedkv.float_to_fp8_bits(np.array(v, np.float32), "fp8_e4m3")]
    assert e4([448, 500, np.inf, -np.inf, np.nan, -np.nan]) == \
        ["0x7e", "0x7e", "0x7e", "0xfe", "0x7f", "0x7f"]
    # Smallest subnormal 2^-9; half of it ties to 0 (even); 1.5 units tie to 2 units.
    assert e4([2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -10, 2.0 ** -6, -0.0, 1.0]) == \
        ["0x1", "0x0", "0x2", "0x8", "0x80", "0x38"]
    e5 = lambda v: [hex(c) for c in pagedkv.float_to_fp8_bits(np.array(v, np.float32), "fp8_e5m2")]
    assert e5([57344, np.inf, np.nan, 2.0 ** -16, 1.0]) == ["0x7b", "0x7b", "0x7f", "0x1", "0x3c"]
    # Values arrive as float32: a float64 just above 1 rounds to 1.0 first.
    assert e4([1.0 + 2.0 ** -30]) == ["0x38"]
    # Shapes are kept.
    assert pagedkv.float_to_fp8_bits(np.zeros((2, 3, 4)), "fp8_e4m3").shape == (2, 3, 4)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_per_tensor_scale(fmt):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(1000) * 30).astype(np.float32)
    s = np.float32(0.37)
    codes = pagedkv.quantize_fp8(x, fmt, float(s))
    assert np.array_equal(codes, reference_encode(x / s, fmt))   # one float32 division
    back = pagedkv.dequantize_fp8(codes, fmt, float(s))
    want = np.array([fp8_value(c, fmt) for c in codes], dtype=np.float32) * s
    assert back.dtype == np.float32 and np.array_equal(back, want)
    bound = 2.0 ** -4 if fmt == "fp8_e4m3" else 2.0 ** -3
    big = np.abs(x) >= 2.0 ** (-6 if fmt == "fp8_e4m3" else -14) * s
    assert np.all(np.abs(back[big] - x[big]) <= bound * np.abs(x[big]))


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_per_token_head_rows(fmt):
    top = np.float32(448.0 if fmt == "fp8_e4m3" else 57344.0)
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 2, 16)) * 3).astype(np.float32)
    x[1, 0] = 0.0                                   # an all-zero row: scale 1
    x[2, 1, 5] = np.nan                             # NaN stays NaN, not in amax
    x[3, 0] *= 1e-39 / 3                            # a tiny row: the FLT_MIN floor
    codes, scales = pagedkv.quantize_fp8_rows(x, fmt)
    assert codes.shape == x.shape and codes.dtype == np.uint8
    assert scales.shape == (4, 2) and scales.dtype == np.float32
    for idx in np.ndindex(4, 2):
        row = x[idx]
        amax = np.float32(np.nanmax(np.abs(row)))
        if amax == 0:
            s = np.float32(1)
        else:
            s = amax / top                              # float32, nearest; then toward zero
            if float(s) * float(top) > float(amax):
                s = np.nextafter(s, np.float32(0))
            s = max(s, np.float32(np.finfo(np.float32).tiny))
        assert scales[idx] == s, idx
        assert np.array_equal(codes[idx], reference_encode(row / s, fmt)), idx
    assert codes[2, 1, 5] == 0x7f and codes[1, 0].tolist() == [0] * 16
    assert scales[3, 0] == np.finfo(np.float32).tiny
    # The row's largest magnitude takes the largest code.
    i = int(np.argmax(np.abs(x[0, 0])))
    assert codes[0, 0, i] & 0x7f == (0x7e if fmt == "fp8_e4m3" else 0x7b)


@pytest.mark.parametrize(
    "call",
    [
        lambda a: pagedkv.quantize_fp8(a, "fp8_e4m3", 0.5),
        lambda a: pagedkv.quantize_fp8_rows(a.reshape(-1, 128), "fp8_e4m3"),
        lambda a: pagedkv.float_to_fp8_bits(a, "fp8_e5m2"),
    ],
    ids=["quantize_fp8", "quantize_fp8_rows", "float_to_fp8_bits"],
)
def test_large_fp8_conversions_release_the_gil(call):
    """A conversion of a large array lets other Python threads run meanwhile. With the switch
    interval raised to 10 s no thread is forced off the GIL between bytecodes, so the main thread
    can run while the worker's call is in flight only if the call released the GIL; holding it,
    the worker keeps it until the thread ends, after the flag is cleared."""
    import sys
    import threading

    values = np.linspace(-500.0, 500.0, 1 << 24, dtype=np.float32)
    started = threading.Event()
    in_call = [False]
    results = []

    def worker():
        in_call[0] = True
        started.set()
        results.append(call(values) is not None)
        in_call[0] = False

    interval = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    try:
        t = threading.Thread(target=worker)
        t.start()
        started.wait()
        seen = 0
        while t.is_alive():
            seen += in_call[0]
            time.sleep(0)  # lets the worker take the GIL back as soon as its call returns
        t.join()
    finally:
        sys.setswitchinterval(interval)
    assert results == [True]
    assert seen > 0, "the main thread never ran while the conversion was in flight"
