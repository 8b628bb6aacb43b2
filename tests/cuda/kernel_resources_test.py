#!/usr/bin/env python3
"""scripts/kernel-resources: the ptxas parser on real nvcc 13.0 output captured from kernels/*.cu
(tests/cuda/data), the spill check passing on it and failing on a synthetic spill at
head_dim <= 128 or in a kernel without head_dim, the wgmma check failing on real output in which
ptxas serialized a kernel's wgmma, the head_dim rule, the device-only compile
command, the sm_90 occupancy formula on known cases, and the dynamic shared memory of the
tensor-core decode variant (DYNAMIC_SMEM) entering its occupancy, and the build's kept device code
(cmake/nvcc_keep_device_code.sh around a stand-in nvcc: what it keeps and prints, a failed compile;
the report reading the kept code, and compiling instead wherever it cannot be trusted). Needs
python3 and c++filt, no nvcc.

  kernel_resources_test.py SCRIPT DATA_DIR
"""
import importlib.machinery
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

SCRIPT = pathlib.Path(sys.argv[1])
DATA = pathlib.Path(sys.argv[2])
SAMPLE = DATA / "ptxas-sm90-cuda13.0.log"
PTX = DATA / "ptx-entries-sm90-cuda13.0.ptx"
SMEM = DATA / "ptxas-smem-callee-sm90-cuda13.0.log"

loader = importlib.machinery.SourceFileLoader("kernel_resources", str(SCRIPT))
spec = importlib.util.spec_from_loader("kernel_resources", loader)
kr = importlib.util.module_from_spec(spec)
loader.exec_module(kr)

failures = []


def expect(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")


def run_check(log_text, *extra):
    with tempfile.TemporaryDirectory() as d:
        log = pathlib.Path(d) / "ptxas.log"
        log.write_text(log_text)
        p = subprocess.run([sys.executable, str(SCRIPT), "check", d + "/out", str(log), str(PTX),
                            *extra], capture_output=True, text=True)
        report = json.loads((pathlib.Path(d) / "out/kernel-resources.json").read_text()) \
            if (pathlib.Path(d) / "out/kernel-resources.json").exists() else None
        return p.returncode, p.stdout + p.stderr, report


def by_kernel(rows):
    return {r["kernel"]: r for r in rows}


sample = SAMPLE.read_text()

# ---- the parser on real output ----
functions = kr.parse_ptxas(sample)
expect(len(functions) == 20 and all(f["entry"] for f in functions),
       f"20 entry functions in the sample, got {len(functions)}")
rows = by_kernel(kr.analyse(functions, kr.parse_ptx_block_sizes(PTX.read_text())))
e256 = rows.get("paged_extend_kernel<Fp16Mma, 256>")
expect(e256 is not None and e256["registers"] == 255 and e256["spill_stores"] == 48
       and e256["spill_loads"] == 56 and e256["stack_frame"] == 48 and e256["head_dim"] == 256,
       f"extend fp16 256: 255 registers, 48/56 B spills, 48 B frame: {e256}")
e128 = rows.get("paged_extend_kernel<Bf16Mma, 128>")
expect(e128 is not None and e128["registers"] == 229 and e128["spill_stores"] == 0
       and e128["spill_loads"] == 0 and e128["head_dim"] == 128 and e128["smem_static"] == 0,
       f"extend bf16 128: 229 registers, no spill: {e128}")
expect(e128 is not None and e128["occupancy"]["threads"] == 128
       and e128["occupancy"]["resident_warps"] == 8,
       f"extend bf16 128: 128 threads (PTX .maxntid), 8 warps per SM: {e128 and e128['occupancy']}")
d64 = rows.get("paged_decode_kernel<Bf16Ops, 64>")
expect(d64 is not None and d64["occupancy"]["resident_ctas"] == 4 and d64["head_dim"] == 64,
       f"decode bf16 64: 4 CTAs per SM: {d64}")
m64 = rows.get("merge_splits_kernel<Fp16Ops, 64>")
expect(m64 is not None and m64["occupancy"]["threads"] == 64, f"merge 64: 64 threads: {m64}")
ka = rows.get("kv_append_kernel")
expect(ka is not None and ka["head_dim"] is None and ka["registers"] == 40,
       f"kv_append: no head_dim, 40 registers: {ka}")

# Static shared memory and a non-entry (noinline) function, also real output.
small = kr.parse_ptxas(SMEM.read_text())
expect(len(small) == 2 and small[0]["entry"] and small[0]["smem_static"] == 1200
       and small[0]["registers"] == 40 and small[0]["stack_frame"] == 256
       and not small[1]["entry"] and small[1]["spill_stores"] == 0,
       f"smem sample: entry with 1200 B smem and a device function: {small}")

# A properties line without its frame line is an error, not a silent zero.
try:
    kr.parse_ptxas("ptxas info    : Function properties for _Z1fv\nptxas info    : Used 3 registers\n")
    expect(False, "a missing spill line is reported as an error")
except kr.Error:
    pass

# ---- the check on the real sample: head_dim 256 spills, which is allowed ----
rc, out, report = run_check(sample)
expect(rc == 0, f"the real sample passes the check (exit {rc}): {out}")
expect(report is not None and report["spill_check"] == "PASS" and "paged_extend_kernel<Fp16Mma, 256>"
       in out, f"the 256 spill is printed as an allowed offender: {out}")
# ... and fails when the limit covers 256: the real spill is seen.
rc, out, _ = run_check(sample, "--max-head-dim", "256")
expect(rc == 1 and "paged_extend_kernel" in out, f"--max-head-dim 256 fails on the real spill: {out}")


# ---- synthetic spills ----
def with_spill(text, mangled_part, stores, loads):
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "Function properties for" in line and mangled_part in line:
            lines[i + 1] = f"    16 bytes stack frame, {stores} bytes spill stores, {loads} bytes spill loads"
            return "\n".join(lines) + "\n"
    raise AssertionError(mangled_part)


extend128 = "paged_extend_kernelINS0_7Bf16MmaELi128E"
rc, out, report = run_check(with_spill(sample, extend128, 8, 8))
expect(rc == 1 and "paged_extend_kernel<pagedkv::(anonymous namespace)::Bf16Mma, 128>" in out,
       f"a spill at head_dim 128 fails the check and is named (exit {rc}): {out}")
expect(report is not None and report["spill_check"] == "FAIL" and len(report["offenders"]) == 1,
       f"the JSON report says FAIL with one offender: {report and report['offenders']}")
rc, out, _ = run_check(with_spill(sample, "paged_decode_kernelINS0_7Fp16OpsELi64E", 0, 4))
expect(rc == 1, f"spill loads alone at head_dim 64 fail the check (exit {rc})")
rc, out, _ = run_check(with_spill(sample, "kv_append_kernel", 4, 0))
expect(rc == 1 and "kv_append_kernel" in out,
       f"a spill in a kernel without head_dim fails the check (exit {rc}): {out}")
rc, out, _ = run_check(with_spill(sample, "merge_splits_kernelINS0_7Bf16OpsELi256E", 4, 4))
expect(rc == 0, f"a spill at head_dim 256 passes (exit {rc}): {out}")

# ---- the head_dim rule ----
expect(kr.head_dim_of("void pagedkv::(anonymous namespace)::k<pagedkv::Ops<2, 3>, 64>(P)")[0] == 64,
       "nested template arguments are not head_dim")
expect(kr.head_dim_of("void pagedkv::(anonymous namespace)::k(P)") == (None, "k"), "no template")
expect(kr.head_dim_of("void k<Ops, (unsigned short)128>(int)")[0] == 128, "cast form")
expect(kr.head_dim_of("void k<Ops, true>(int)")[0] is None, "a bool is not head_dim")
expect(kr.head_dim_of("void k<Ops, 128u>(int)")[0] == 128, "unsigned literal")
expect(kr.head_dim_of("void pagedkv::k<true, 128, (pagedkv::kernels::Merge)2>(P)") ==
       (128, "k<true, 128, (Merge)2>"), "an enum argument: its cast kept, namespaces dropped")
expect(kr.head_dim_of("void k<pagedkv::Ops<pagedkv::X, 2>, 64>(P)")[1] == "k<Ops<X, 2>, 64>",
       "namespaces dropped inside a nested argument")
try:
    kr.head_dim_of("void pagedkv::k<Ops, 128, 16>(P)")
    expect(False, "two integer template arguments without a HEAD_DIM_ARG entry are an error")
except kr.Error:
    pass
kr.HEAD_DIM_ARG["k2"] = 0
expect(kr.head_dim_of("void pagedkv::k2<Ops, 128, 16>(P)")[0] == 128, "HEAD_DIM_ARG picks one")

# ---- the device-only compile command (as CMake writes it) ----
nvcc, flags, archs = kr.device_only(
    ["/usr/bin/ccache", "/usr/local/cuda/bin/nvcc", "-forward-unknown-to-host-compiler",
     "--options-file", "x.rsp", "-O3", "-DNDEBUG",
     "--generate-code=arch=compute_90,code=[compute_90,sm_90]",
     "--generate-code=arch=compute_80,code=[sm_80]", "-Xcompiler=-fPIC", "-std=c++20",
     "-MD", "-MT", "a.o", "-MF", "a.d", "-x", "cu", "-c", "/src/kernels/a.cu", "-o", "a.o"],
    "/src/kernels/a.cu")
expect(nvcc == "/usr/local/cuda/bin/nvcc", f"the launcher is dropped: {nvcc}")
expect(archs == [("compute_80", "sm_80"), ("compute_90", "sm_90")], f"real archs: {archs}")
expect(flags == ["-forward-unknown-to-host-compiler", "--options-file", "x.rsp", "-O3", "-DNDEBUG",
                 "-Xcompiler=-fPIC", "-std=c++20", "-x", "cu"],
       f"flags keep everything but output, dependencies, arch and source: {flags}")

# ---- occupancy on sm_90: known cases ----
OCC = [
    # registers, static smem, threads -> resident CTAs, warps per SM, limiter
    (229, 0, 128, 2, 8, "registers"),  # extend head_dim 128 (issue 35: 8 warps per SM)
    (128, 0, 128, 4, 16, "registers"),  # decode: 4 CTAs x 4 warps
    (255, 0, 32, 8, 8, "registers"),  # 8160 -> 8192 registers per warp
    (33, 0, 128, 12, 48, "registers"),  # 1056 -> 1280 per warp, 5120 per CTA
    (32, 0, 256, 8, 64, "registers"),  # full: regs and warps both allow 8
    (16, 0, 32, 32, 32, "CTAs"),  # the 32-CTA limit
    (16, 0, 1024, 2, 64, "warps"),
    (32, 100 * 1024, 128, 2, 8, "shared memory"),  # (102400 + 1024) x 2 <= 233472
    (32, 48 * 1024, 128, 4, 16, "shared memory"),  # 50176 x 4 = 200704
    (32, 45 * 1024, 128, 4, 16, "shared memory"),  # 5 x 45 KiB fit only without the 1 KiB reserve
    (32, 227 * 1024, 128, 1, 4, "shared memory"),  # the most one CTA may have
    (32, 227 * 1024 + 1, 128, 0, 0, "shared memory"),  # does not fit
    (0, 0, 64, 32, 64, "warps"),  # 0 registers counts as 1; warps and CTAs both at 32
]
for regs, smem, threads, ctas, warps, limiter in OCC:
    o = kr.occupancy(regs, smem, threads)
    expect(o["resident_ctas"] == ctas and o["resident_warps"] == warps
           and limiter in o["limited_by"],
           f"occupancy({regs} regs, {smem} B, {threads} threads): want {ctas} CTAs, {warps} warps "
           f"by {limiter}, got {o}")

# ---- dynamic shared memory the script knows (DYNAMIC_SMEM): the tensor-core decode variant ----
TC = "_ZN7pagedkv7kernels55_GLOBAL__N__a9d1bf7f_22_decode_attention_tc_cu_40a8c36016tc_decode_kernelILb1ELi{}ELb0EEEvNS1_8TcParamsE"
for hd, regs, ctas, limiter in [(64, 117, 4, "shared memory"), (128, 189, 2, "shared memory"),
                                (256, 255, 1, "shared memory")]:
    f = {"mangled": TC.format(hd), "arch": "sm_90", "entry": True, "registers": regs,
         "stack_frame": 0, "spill_stores": 0, "spill_loads": 0, "smem_static": 0, "barriers": 1}
    (row,) = kr.analyse([f], {f["mangled"]: 128})
    o = row["occupancy"]
    expect(row["kernel"] == f"tc_decode_kernel<true, {hd}, false>" and row["head_dim"] == hd
           and row["smem_dynamic"] == kr.DYNAMIC_SMEM["tc_decode_kernel"][hd]
           and o["resident_ctas"] == ctas and limiter in o["limited_by"],
           f"tc_decode_kernel head_dim {hd}: dynamic smem counted, {ctas} CTAs by {limiter}: {row}")
    md = kr.markdown([row], 128, [])
    expect(f"0 + {kr.DYNAMIC_SMEM['tc_decode_kernel'][hd]} dynamic" in md,
           f"the report shows the dynamic amount: {md}")

# ---- the wgmma rule, on real output: ptxas serializing a pipelined kernel's wgmma ----
# nvcc 13.0 (-cubin --resource-usage, sm_90a) on a copy of kernels/extend_attention_wgmma.cu whose
# pipelined kernel (kPipelined = true) reads an O accumulator while the PV GEMM is in flight:
# ptxas serializes the wgmma of those four instantiations; the other four are as built.
serial_log = (DATA / "ptxas-wgmma-serialized-sm90a-cuda13.0.log").read_text()
functions = kr.parse_ptxas(serial_log, default_arch="sm_90a")
flagged = [f for f in functions if f["wgmma_serialized"]]
expect(len(functions) == 8 and len(flagged) == 4
       and all("ELb1EEEv" in f["mangled"] for f in flagged)
       and all(f["wgmma_serialized"].startswith("insufficient register resources")
               for f in flagged),
       f"8 functions, the 4 pipelined ones serialized: "
       f"{[(f['mangled'][-40:], f['wgmma_serialized']) for f in functions]}")
rc, out, report = run_check(serial_log)
expect(rc == 1 and "serialized the wgmma of 4 kernel(s)" in out and report is not None
       and report["wgmma_check"] == "FAIL" and len(report["wgmma_serialized"]) == 4
       and report["spill_check"] == "PASS",
       f"a serialized wgmma fails the check (exit 1), spills aside: rc={rc} {out}")
unserial = "\n".join(l for l in serial_log.splitlines() if "Potential Performance Loss" not in l)
rc, out, report = run_check(unserial)
expect(rc == 0 and report["wgmma_check"] == "PASS" and "no serialized wgmma" in out,
       f"the same output without the advisories passes: rc={rc} {out}")
rc, out, report = run_check(sample)
expect(report is not None and report["wgmma_check"] == "PASS" and not report["wgmma_serialized"],
       f"the real sample has no serialized wgmma: {out}")
orphan = ("ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are "
          "serialized due to the presence of Extern calls in the function '_Z6absentv'\n" + sample)
rc, out, _ = run_check(orphan)
expect(rc == 2 and "_Z6absentv" in out,
       f"an advisory for a function ptxas reports nothing else for is a parse error: rc={rc} {out}")
md = kr.markdown(kr.analyse(functions, {}), 128, [])
expect("wgmma check: FAIL" in md and "insufficient register resources" in md,
       f"the report names the serialized kernels and the reason: {md[-400:]}")

# ---- SASS (nvdisasm) ----
# Real `nvdisasm -c -hex` output (Debian's nvdisasm 11.8 on CUDA 13.0 cubins read through
# old_abi_cubin) of fa2_extend_kernel<true, 128, 4, false> (sm_90), the persistent warp-specialized
# kernel wgmma_ws_extend_kernel<true, false, true, true> (sm_90a) and
# tc_decode_kernel<false, 128, false, (TcDecodeMerge)2, false> (sm_90). nvdisasm 11.8 leaves some
# of CUDA 13's instructions unprinted (blank lines) and leaves out some labels, the tc
# kernel's tile-loop head among them: its back edge is placed from the branch's encoding.
import gzip  # noqa: E402

sass_text = gzip.open(DATA / "nvdisasm-11.8-hex-fa2-ws-tc-cuda13.0.sass.gz", "rt").read()
sass = kr.parse_sass(sass_text)
fa2_name = next((k for k in sass if "fa2_extend_kernelILb1ELi128ELi4ELb0E" in k), None)
ws_name = next((k for k in sass if "wgmma_ws_extend_kernelILb1ELb0ELb1ELb1E" in k), None)
tc_name = next((k for k in sass if "tc_decode_kernelILb0ELi128ELb0ELNS0_13TcDecodeMergeE2E" in k),
               None)
expect(len(sass) == 3 and fa2_name and ws_name and tc_name, f"three functions parsed: {list(sass)}")
if fa2_name and ws_name and tc_name:
    expect(sass[fa2_name]["counts"] == {"HMMA": 80, "HGMMA": 0, "LDSM": 24, "LDGSTS": 24,
                                        "LDL": 0, "STL": 0},
           f"fa2 counts: {sass[fa2_name]['counts']}")
    expect(sass[ws_name]["counts"] == {"HMMA": 0, "HGMMA": 24, "LDSM": 0, "LDGSTS": 8,
                                       "LDL": 0, "STL": 0},
           f"ws counts: {sass[ws_name]['counts']}")
    expect(sass[tc_name]["counts"] == {"HMMA": 32, "HGMMA": 0, "LDSM": 16, "LDGSTS": 48,
                                       "LDL": 0, "STL": 0},
           f"tc counts: {sass[tc_name]['counts']}")
    expect(all(sass[n]["instructions"] > 1000 for n in (fa2_name, ws_name, tc_name)),
           "instruction counts")
    expect(sass[fa2_name]["ex2_after_pv_wait"] is None and sass[ws_name]["ex2_after_pv_wait"] == 0,
           f"the ws kernel's exponentials before its PV wait, fa2 has no wgmma loop: "
           f"{sass[fa2_name]['ex2_after_pv_wait']}, {sass[ws_name]['ex2_after_pv_wait']}")

    # Loops. Each kernel's tile loop: fa2's holds all its MMA and ldmatrix and the next tile's
    # cp.async; the ws kernel's consumers run their 12 warpgroup MMAs a tile in one loop and its
    # producer the 8 cp.async of a tile in another, no loop holding both; the tc decode kernel's
    # tile loop is found although its head has no label.
    def loop_counts(name, group):
        loop = kr.loop_holding(sass[name], group)
        return None if loop is None else {k: v for k, v in loop["counts"].items() if v}

    expect(all(sass[n]["loops_unplaced"] is None for n in (fa2_name, ws_name, tc_name)),
           "every loop placed: "
           f"{[sass[n]['loops_unplaced'] for n in (fa2_name, ws_name, tc_name)]}")
    expect(loop_counts(fa2_name, ("HMMA", "LDSM", "LDGSTS")) == {"HMMA": 80, "LDSM": 24,
                                                                "LDGSTS": 8},
           f"fa2's tile loop: {loop_counts(fa2_name, ('HMMA', 'LDSM', 'LDGSTS'))}")
    expect(loop_counts(ws_name, ("HGMMA",)) == {"HGMMA": 12}
           and loop_counts(ws_name, ("LDGSTS",)) == {"LDGSTS": 8}
           and loop_counts(ws_name, ("HGMMA", "LDGSTS")) is None,
           f"the ws kernel's consumer and producer loops: {loop_counts(ws_name, ('HGMMA',))}, "
           f"{loop_counts(ws_name, ('LDGSTS',))}, {loop_counts(ws_name, ('HGMMA', 'LDGSTS'))}")
    tc_loop = kr.loop_holding(sass[tc_name], ("HMMA", "LDSM", "LDGSTS"))
    expect(loop_counts(tc_name, ("HMMA", "LDSM", "LDGSTS")) == {"HMMA": 32, "LDSM": 16,
                                                               "LDGSTS": 16},
           f"the tc decode kernel's tile loop: {loop_counts(tc_name, ('HMMA', 'LDSM', 'LDGSTS'))}")

    def tc_lines():
        """The tc kernel's lines: (index in sass_text's lines, line)."""
        lines = sass_text.splitlines()
        first = next(i for i, l in enumerate(lines) if tc_name in l and l.startswith("//"))
        return lines, range(first, len(lines))

    def branch_target(lines, i):
        m = re.match(r"^\s*/\*([0-9a-f]+)\*/.*\bBRA\b.*/\* 0x([0-9a-f]{16}) \*/", lines[i])
        if not m:
            return None
        high = re.search(r"0x([0-9a-f]{16})", lines[i + 1]).group(1)
        return int(m.group(1), 16) + 16 + kr.bra_offset(int(m.group(2), 16) | int(high, 16) << 64)

    if tc_loop is not None:
        lines, tc_range = tc_lines()
        # The header is the first printed instruction at or after a branch's target.
        printed = sorted(int(m.group(1), 16) for m in (
            re.match(r"^\s*/\*([0-9a-f]+)\*/", lines[i]) for i in tc_range) if m)

        def lands_on(target):
            return None if target is None else next((pc for pc in printed if pc >= target), None)

        back = [i for i in tc_range if lands_on(branch_target(lines, i)) == tc_loop["header"]]
        label = re.search(r"`\((\.L\w+)\)", lines[back[0]]).group(1) if back else None
        expect(len(back) == 1 and label and f"{label}:" not in sass_text,
               f"the tc tile loop's back edge branches to an unprinted label: {back}, {label}")
        # Without its back edge (the branch turned into a NOP) the tile loop is gone: the kernel
        # fails its rule, naming what no loop holds.
        no_loop = list(lines)
        for i in back:
            no_loop[i] = no_loop[i].replace("BRA", "NOP", 1)
        rows = [{"kernel": "tc_decode_kernel<...>", "demangled": tc_name, "source": "x.cu",
                 "entry": True, "sass": kr.parse_sass("\n".join(no_loop))[tc_name],
                 "head_dim": 128}]
        bad = kr.sass_offenders(rows, 128)
        expect([w for _, w in bad] == ["no loop holds HMMA + LDSM + LDGSTS (at most 0 of 32 HMMA, "
                                       "0 of 16 LDSM, 0 of 48 LDGSTS in one loop)"],
               f"the tc kernel without its tile loop fails: {[w for _, w in bad]}")
        # A branch whose printed label and encoding disagree: the encoding is not understood,
        # an error rather than a guess.
        labelled = next(i for i in tc_range if branch_target(lines, i) is not None
                        and re.search(r"`\((\.L\w+)\)", lines[i]).group(1) + ":" in sass_text)
        wrong = list(lines)
        wrong[labelled] = re.sub(r"/\* 0x([0-9a-f]{16}) \*/",
                                 lambda m: "/* 0x%016x */" % (int(m.group(1), 16) ^ (1 << 20)),
                                 wrong[labelled])
        try:
            kr.parse_sass("\n".join(wrong))
            expect(False, "a label and an encoding that disagree are an error")
        except kr.Error as e:
            expect("bra_offset does not know this encoding" in str(e), f"the error says so: {e}")
    # Without -hex the labels nvdisasm 11.8 leaves out cannot be replaced: the loops are not
    # placed and the rule kernels fail, never a silent pass.
    no_hex = re.sub(r"\s*/\* 0x[0-9a-f]{16} \*/", "", sass_text)
    unplaced = kr.parse_sass(no_hex)
    expect(all(v["loops"] is None and "no encoding (nvdisasm -hex)" in v["loops_unplaced"]
               for v in unplaced.values()),
           f"no hex, no loops: {[v['loops_unplaced'] for v in unplaced.values()]}")
    expect(kr.bra_offset(0x000fea0003800000 << 64 | 0x00000000002c8947) == 176
           and kr.bra_offset(0x010fec0003800000 << 64 | 0x0000000400301947) == 1216
           and kr.bra_offset(0xfea000383fffffffffff000a4b947) == -3440,
           "bra_offset on three branches of the build (forward, across bit 10, backward)")

    # The same kernel before wgmma::compute_before_wait (nvdisasm -c, no -hex): ptxas had put all
    # 34 exponentials of a tile (32 scores, 2 rescale factors) after the wait for the PV GEMM.
    before = kr.parse_sass(gzip.open(DATA / "nvdisasm-11.8-ws-exp-after-wait-cuda13.0.sass.gz",
                                     "rt").read())
    expect([v["ex2_after_pv_wait"] for v in before.values()] == [34],
           f"the old schedule is seen: {[v['ex2_after_pv_wait'] for v in before.values()]}")
    # ... and used exp2f, whose denormal path puts a range test against -126 beside each of the
    # 34 exponentials of the first tile and of the loop; the current kernel uses exp2_ftz
    # (none), and fa2 (kFa2's instantiations are not in SASS_FTZ_EXP2) still uses exp2f.
    expect([v["exp2_denormal_tests"] for v in before.values()] == [68]
           and sass[ws_name]["exp2_denormal_tests"] == 0
           and sass[fa2_name]["exp2_denormal_tests"] > 0,
           f"denormal tests: old {[v['exp2_denormal_tests'] for v in before.values()]}, "
           f"ws {sass[ws_name]['exp2_denormal_tests']}, fa2 {sass[fa2_name]['exp2_denormal_tests']}")
    old_rows = [{"kernel": "wgmma_ws_extend_kernel<...>", "demangled": k, "source": "x.cu",
                 "entry": True, "sass": v, "head_dim": None} for k, v in before.items()]
    bad = kr.sass_offenders(old_rows, 128)
    expect(len(bad) == 3 and "its loops cannot be placed" in bad[0][1]
           and "68 denormal range tests of exp2f" in bad[1][1]
           and "34 exponentials (MUFU.EX2) after the wait for the PV GEMM" in bad[2][1],
           f"the old kernel fails every rule: {[w for _, w in bad]}")

    def sass_rows(text, head_dim=128):
        rows = []
        for name, counts in kr.parse_sass(text).items():
            base = ("fa2_extend_kernel" if "fa2_extend" in name else
                    "tc_decode_kernel" if "tc_decode" in name else "wgmma_ws_extend_kernel")
            rows.append({"kernel": base + "<...>", "demangled": name, "source": "x.cu",
                         "entry": True, "sass": counts,
                         "head_dim": None if base == "wgmma_ws_extend_kernel" else head_dim})
        return rows

    expect(kr.sass_offenders(sass_rows(sass_text), 128) == [], "the real kernels pass the rules")
    missing = [dict(r, sass=None) for r in sass_rows(sass_text)]
    bad = kr.sass_offenders(missing, 128)
    expect(len(bad) == 3 and all(w == "not found in the disassembly" for _, w in bad),
           f"rule kernels missing from the disassembly fail: {[w for _, w in bad]}")
    # A second wait pair in one function with exponentials after its PV wait is seen too.
    ws_end = sass_text.index("//--------------------- .text." + tc_name)
    doubled = sass_text[:ws_end] + "\n".join([
        "        /*ff00*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;",
        "        /*ff10*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;",
        "        /*ff20*/                   MUFU.EX2 R1, R2 ;",
        "        /*ff30*/                   WARPGROUP.ARRIVE ;", ""]) + sass_text[ws_end:]
    expect(kr.parse_sass(doubled)[ws_name]["ex2_after_pv_wait"] == 1,
           f"the worst wait pair counts: {kr.parse_sass(doubled)[ws_name]['ex2_after_pv_wait']}")
    # Each rule broken on a copy: no ldmatrix in fa2 and tc (LDSM turned into LDS), no warpgroup
    # MMA in the ws kernel, a local store in each.
    no_ldsm = re.sub(r"\bLDSM\b", "LDS", sass_text)
    bad = kr.sass_offenders(sass_rows(no_ldsm), 128)
    expect(sorted((r["kernel"], w) for r, w in bad)
           == [("fa2_extend_kernel<...>", "no LDSM"), ("tc_decode_kernel<...>", "no LDSM")],
           f"fa2 and tc without LDSM fail: {[(r['kernel'], w) for r, w in bad]}")
    no_hgmma = re.sub(r"\bHGMMA\b", "HMMA", sass_text)
    bad = kr.sass_offenders(sass_rows(no_hgmma), 128)
    expect(len(bad) == 1 and "wgmma_ws" in bad[0][0]["demangled"] and bad[0][1] == "no HGMMA",
           f"the ws kernel without HGMMA fails: {[(r['kernel'], w) for r, w in bad]}")
    local = re.sub(r"(/\*[0-9a-f]+\*/\s+)(STS|LDS)\.128\b", r"\1STL.128", sass_text, count=0)
    bad = kr.sass_offenders(sass_rows(local), 128)
    expect(len(bad) == 3 and all("local-memory instructions" in w for _, w in bad),
           f"local stores fail every kernel: {[(r['kernel'], w) for r, w in bad]}")
    expect([w for r, w in kr.sass_offenders(sass_rows(local, head_dim=256), 128)
            if "fa2_extend" in r["demangled"] or "tc_decode" in r["demangled"]] == [],
           "local memory at head_dim 256 is allowed (as spills are)")
    md = kr.markdown([dict(r, head_dim=128, arch="sm_90", registers=1, spill_stores=0,
                           spill_loads=0, stack_frame=0, smem_static=0, occupancy=None)
                      for r in sass_rows(no_ldsm)], 128, [], sass_checked=True)
    expect("SASS check (" in md and "FAIL: `fa2_extend_kernel<...>` no LDSM" in md
           and "| 80 / 0 / 0 / 24 / 0 |" in md
           and "| 0 / 24 / 0 / 8 / 0; EX2 after the PV wait: 0; HGMMA loop: " in md
           and "; LDGSTS loop: " in md,
           f"the report's SASS column and check line: {md[-900:]}")
    md = kr.markdown([dict(r, head_dim=128, arch="sm_90", registers=1, spill_stores=0,
                           spill_loads=0, stack_frame=0, smem_static=0, occupancy=None)
                      for r in sass_rows(sass_text)], 128, [], sass_checked=True)
    fa2_loop = kr.loop_holding(sass[fa2_name], ("HMMA", "LDSM", "LDGSTS"))["instructions"]
    expect(f"| 80 / 0 / 24 / 24 / 0; HMMA+LDSM+LDGSTS loop: {fa2_loop} instructions, "
           "80 / 0 / 24 / 8 / 0 |" in md
           and "(HGMMA) in one loop and (LDGSTS) in one loop" in md and "PASS." in md,
           f"the report's loop cells: {md[-900:]}")
    md = kr.markdown([], 128, [], sass_checked=False)
    expect("SASS check: not run (no nvdisasm)." in md, "a report without nvdisasm says so")


# A label printed on the instruction after an unprinted one the branch's encoding names (0x20):
# accepted, the label is where the branch lands; an encoding past the label's is an error.
def bra_words(pc, target):
    off = target - pc - 16
    low = 0x947 | ((off >> 2) & 0xFF) << 16 | ((off >> 10) & ((1 << 48) - 1)) << 34
    return (f"/* 0x{low & ((1 << 64) - 1):016x} */",
            f"/* 0x{(low >> 64) | 0x000fea0003800000:016x} */")


for target, ok in ((0x20, True), (0x40, False)):
    lo, hi = bra_words(0x0, target)
    text = "\n".join([
        "//--------------------- .text.k --------------------------",
        f"        /*0000*/              @P0 BRA `(.L_x_1) ;   {lo}",
        f"                                                   {hi}",
        "        /*0010*/                   NOP ;   /* 0x0000000000007918 */",
        "                                           /* 0x000fc00000000000 */",
        "",
        "",
        ".L_x_1:",
        "        /*0030*/                   EXIT ;   /* 0x000000000000794d */",
        "                                            /* 0x000fea0003800000 */"])
    try:
        k = kr.parse_sass(text)["k"]
        expect(ok and k["loops"] == [], f"a label after an unprinted target: {k}")
    except kr.Error as e:
        expect(not ok and "bra_offset does not know this encoding" in str(e),
               f"an encoding past its label: {e}")
expect(kr.bra_offset(int(bra_words(0x100, 0x40)[0][5:21], 16)
                     | int(bra_words(0x100, 0x40)[1][5:21], 16) << 64) == 0x40 - 0x110,
       "bra_words encodes what bra_offset reads (backward)")


# Which kernels must use the flushing exponential: the wgmma ones, and kFa2LeanSoftmax's
# instantiations of fa2_extend_kernel (last template argument true), not kFa2's.
expect([kr.ftz_softmax(k) for k in (
    "wgmma_extend_kernel<true, false, true>", "wgmma_ws_extend_kernel<false, false, true, true>",
    "fa2_extend_kernel<true, 128, 4, false, true>", "fa2_extend_kernel<true, 128, 4, true, false>",
    "fa2_extend_kernel<...>", "tc_decode_kernel<false, 128, false, (TcDecodeMerge)2, true>")]
       == [True, True, True, False, False, False], "ftz_softmax")
lean_row = {"kernel": "fa2_extend_kernel<true, 128, 4, false, true>", "demangled": "x",
            "source": "x.cu", "entry": True, "head_dim": 128,
            "sass": dict(sass[fa2_name]) if fa2_name else None}
bad = kr.sass_offenders([lean_row], 128)
expect([w for _, w in bad] == [f"{sass[fa2_name]['exp2_denormal_tests']} denormal range tests of "
                               "exp2f (FSETP against -126): its softmax should use exp2_ftz"],
       f"a lean instantiation with exp2f's denormal path fails: {[w for _, w in bad]}")
# ... at every head_dim (the other rules stop at --max-head-dim; this one is not about spills).
bad = kr.sass_offenders([dict(lean_row, head_dim=256,
                              kernel="fa2_extend_kernel<true, 256, 4, false, true>")], 128)
expect(len(bad) == 1 and "denormal range tests" in bad[0][1],
       f"head_dim 256 too: {[w for _, w in bad]}")
bad = kr.sass_offenders([dict(lean_row, head_dim=256,
                              kernel="fa2_extend_kernel<true, 256, 4, false, false>")], 128)
expect(bad == [], f"kFa2's instantiations keep exp2f: {[w for _, w in bad]}")


# Natural loops on small control-flow graphs: (pc, opcode, modifiers, guarded, target).
def loops_of(insns):
    return [(l["header"], l["instructions"], {k: v for k, v in l["counts"].items() if v})
            for l in kr.natural_loops(insns)]


simple = [(0x00, "MOV", "", False, None), (0x10, "HMMA", "", False, None),
          (0x20, "BRA", "", True, 0x10), (0x30, "EXIT", "", False, None)]
expect(loops_of(simple) == [(0x10, 2, {"HMMA": 1})], f"a simple loop: {loops_of(simple)}")
nested = [(0x00, "MOV", "", False, None), (0x10, "LDGSTS", "", False, None),
          (0x20, "HMMA", "", False, None), (0x30, "BRA", "", True, 0x20),
          (0x40, "BRA", "", True, 0x10), (0x50, "EXIT", "", False, None)]
expect(loops_of(nested) == [(0x20, 2, {"HMMA": 1}), (0x10, 4, {"HMMA": 1, "LDGSTS": 1})],
       f"nested loops, the inner first: {loops_of(nested)}")
# A cycle entered at two blocks (irreducible) is no natural loop: what only it holds is in no loop.
irreducible = [(0x00, "BRA", "", True, 0x30), (0x10, "HMMA", "", False, None),
               (0x20, "EXIT", "", True, None), (0x30, "NOP", "", False, None),
               (0x40, "BRA", "", True, 0x10), (0x50, "EXIT", "", False, None)]
expect(loops_of(irreducible) == [], f"an irreducible cycle: {loops_of(irreducible)}")
# A subroutine called in a loop is not part of the loop; its own loop is.
called = [(0x00, "NOP", "", False, None), (0x10, "CALL", ".REL.NOINC", False, 0x40),
          (0x20, "BRA", "", True, 0x00), (0x30, "EXIT", "", False, None),
          (0x40, "LDGSTS", "", False, None), (0x50, "BRA", "", True, 0x40),
          (0x60, "RET", ".REL.NODEC", False, None)]
expect(loops_of(called) == [(0x40, 2, {"LDGSTS": 1}), (0x00, 3, {})],
       f"a call in a loop: {loops_of(called)}")
# A branch to an instruction the disassembler did not print (0x20) lands on the next printed one.
gap = [(0x00, "MOV", "", False, None), (0x10, "MOV", "", False, None),
       (0x30, "HMMA", "", False, None), (0x40, "BRA", "", True, 0x20),
       (0x50, "EXIT", "", False, None)]
expect(loops_of(gap) == [(0x30, 2, {"HMMA": 1})],
       f"a target on an unprinted instruction: {loops_of(gap)}")
# A branch conditional on a predicate operand rather than a guard keeps its fall-through edge:
# the loop after it is reached (taken for unconditional, the loop would be dead code).
operand = [(0x00, "BRA", "", True, 0x30), (0x10, "HMMA", "", False, None),
           (0x20, "BRA", "", True, 0x10), (0x30, "EXIT", "", False, None)]
expect(loops_of(operand) == [(0x10, 2, {"HMMA": 1})], f"a conditional skip: {loops_of(operand)}")
parsed = kr.parse_sass("\n".join([
    "//--------------------- .text.k --------------------------",
    "        /*0000*/                   BRA P1, `(.L_x_1) ;",
    ".L_x_2:",
    "        /*0010*/                   HMMA.16816.F32 R4, R8, R12, R4 ;",
    "        /*0020*/              @P0 BRA `(.L_x_2) ;",
    ".L_x_1:",
    "        /*0030*/                   EXIT ;"]))["k"]
expect(parsed["loops_unplaced"] is None
       and [(l["header"], l["instructions"]) for l in parsed["loops"]] == [(0x10, 2)],
       f"parse_sass: a predicate operand makes a branch conditional, labels place the loop: "
       f"{parsed}")


# The cubin's own code beside the disassembly: a minimal ELF64 with .shstrtab and .text.k.
def tiny_cubin(code):
    names = b"\0.shstrtab\0.text.k\0"
    header = bytearray(0x40)
    header[:5] = b"\x7fELF\x02"
    shoff = 0x40 + len(names) + len(code)
    header[0x28:0x30] = shoff.to_bytes(8, "little")
    header[0x3a:0x3c] = (0x40).to_bytes(2, "little")
    header[0x3c:0x3e] = (3).to_bytes(2, "little")
    header[0x3e:0x40] = (1).to_bytes(2, "little")

    def sh(name, off, size):
        e = bytearray(0x40)
        e[0:4] = name.to_bytes(4, "little")
        e[0x18:0x20] = off.to_bytes(8, "little")
        e[0x20:0x28] = size.to_bytes(8, "little")
        return bytes(e)

    return (bytes(header) + names + code + sh(0, 0, 0) + sh(1, 0x40, len(names))
            + sh(11, 0x40 + len(names), len(code)))


def word(opcode):
    return opcode.to_bytes(16, "little")


expect(kr.cubin_functions(tiny_cubin(word(0x7918) * 3)) == {"k": word(0x7918) * 3},
       f"the code of each .text section: {kr.cubin_functions(tiny_cubin(word(0x7918) * 3))}")
expect(kr.cubin_functions(b"not an elf") == {} and kr.cubin_functions(tiny_cubin(b"")[:0x50]) == {},
       "no ELF, or a section table cut short: no code")
gap_text = "\n".join([
    "//--------------------- .text.k --------------------------",
    ".L_x_0:",
    "        /*0000*/                   HMMA.16816.F32 R4, R8, R12, R4 ;",
    "        /*0010*/              @P0 BRA `(.L_x_0) ;",
    "",
    "        /*0030*/                   EXIT ;"])
# 0x20 left unprinted: an unknown non-control instruction (opcode 0x836) is passed over and
# counted; a BRA there (0x947) might be a back edge nobody sees, so the loops are not placed.
for opcode, placed in ((0x836, True), (0x947, False)):
    code = kr.cubin_functions(tiny_cubin(word(0x7918) + word(0x7947) + word(opcode)
                                         + word(0x794d)))
    k = kr.parse_sass(gap_text, code)["k"]
    expect(k.get("unprinted") == 1 and (k["loops"] is not None) == placed
           and (placed or "leaves out a control instruction at 0x20" in k["loops_unplaced"]),
           f"an unprinted instruction of opcode {opcode:#x}: {k}")
for insns, why in ((simple[:2] + [(0x20, "BRX", "", False, None)], "an indirect branch"),
                   (simple[:2] + [(0x20, "BRA", "", False, None)], "without a target"),
                   (simple[:2] + [(0x20, "BRA", "", True, 0x400)], "outside the function")):
    try:
        kr.natural_loops(insns)
        expect(False, f"{why}: loops cannot be placed")
    except kr.LoopsUnplaced as e:
        expect(why in str(e), f"{why}: {e}")

# The CUDA 13 ELF header rewritten for nvdisasm 11.8: OS/ABI 0x41 -> 0x33, ABI version 8 -> 7,
# e_flags 0x06005a04 (SM 90 in bits 8-15) -> 0x005a055a (SM | virtual SM << 16 | 64-bit).
header = bytearray(64)
header[:4] = b"\x7fELF"
header[4] = 2
header[7], header[8] = 0x41, 8
header[0x30:0x34] = (0x06005A04).to_bytes(4, "little")
old = kr.old_abi_cubin(bytes(header) + b"code")
expect(old is not None and old[7] == 0x33 and old[8] == 7
       and int.from_bytes(old[0x30:0x34], "little") == 0x005A055A and old[64:] == b"code",
       f"old_abi_cubin: {old[:64].hex() if old else None}")
expect(kr.old_abi_cubin(b"not an ELF file at all, no header here, " * 2) is None,
       "old_abi_cubin refuses a non-ELF file")
try:
    kr.find_nvdisasm(str(DATA / "ptxas-sm90-cuda13.0.log"), None)
    expect(False, "a --nvdisasm that is not executable is refused")
except kr.Error as e:
    expect("not an executable file" in str(e), f"--nvdisasm refusal names the problem: {e}")

# ---- the build's kept device code (PAGEDKV_CUDA_KEEP_DEVICE_CODE) ----
# cmake/nvcc_keep_device_code.sh around a stand-in nvcc (a shell script: it writes the object, the
# PTX, a cubin and host intermediates into --keep-dir, prints ptxas's resource lines and a warning),
# then kernel-resources' report reading what it kept, with a stand-in nvcc that fails any compile:
# a report that passes read the kept code, compiled nothing.
LAUNCHER = SCRIPT.resolve().parent.parent / "cmake" / "nvcc_keep_device_code.sh"
FAKE_NVCC = """#!/usr/bin/env bash
if [ "${1:-}" = --version ]; then echo "Cuda compilation tools, release 99.9, V99.9.0"; exit 0; fi
out=""; keep=""; prev=""; src=""; mf=""
for a in "$@"; do
  [ "$prev" = -o ] && out="$a"; [ "$prev" = --keep-dir ] && keep="$a"; [ "$prev" = -MF ] && mf="$a"
  case "$a" in *.cu) src="$a" ;; esac
  prev="$a"
done
[ -n "${FAKE_NVCC_FAIL:-}" ] && { echo "fake.cu(1): error: broken on purpose" >&2; exit 3; }
case " $* " in *" -cubin "*) echo "stand-in nvcc: asked to compile again" >&2; exit 4 ;; esac
stem="$(basename "$src" .cu)"
if [ -n "$keep" ] && [ -z "${FAKE_CACHE_HIT:-}" ]; then
  cp "$FAKE_PTX" "$keep/$stem.ptx"
  printf 'cubin' >"$keep/$stem.sm_90.cubin"
  printf 'host' >"$keep/$stem.cpp1.ii"
  cat "$FAKE_LOG"
fi
echo "fake.cu(7): warning #177-D: variable x was declared but never referenced"
printf 'object' >"$out"
[ -n "$mf" ] && printf '%s : %s \\\n    %s\n' "$out" "$src" "$FAKE_HEADER" >"$mf"
exit 0
"""


def kept_tree(d, sample_log):
    """A build tree of one kernel source compiled through the launcher: (tree, source, args)."""
    d = pathlib.Path(d)
    nvcc = d / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    src = d / "src" / "fake_attention.cu"
    src.parent.mkdir()
    src.write_text("// stand-in source\n")
    (d / "src" / "inc").mkdir()
    (d / "src" / "inc" / "tiles.cuh").write_text("// stand-in header\n")
    tree = d / "tree"
    (tree / "CMakeFiles/pagedkv_cuda.dir/kernels").mkdir(parents=True)
    obj = "CMakeFiles/pagedkv_cuda.dir/kernels/fake_attention.cu.o"
    args = [str(nvcc), "-O3", f"-I{d / 'src' / 'inc'}",
            "--generate-code=arch=compute_90,code=[compute_90,sm_90]",
            "-std=c++20", "-x", "cu", "-c", str(src), "-o", obj]
    (tree / "compile_commands.json").write_text(json.dumps(
        [{"directory": str(tree), "file": str(src), "command": " ".join(args)}]))
    log = d / "sample.log"
    log.write_text(sample_log)
    env = dict(os.environ, FAKE_PTX=str(PTX.resolve()), FAKE_LOG=str(log.resolve()),
               FAKE_HEADER=str((d / "src" / "inc" / "tiles.cuh").resolve()))
    p = subprocess.run([str(LAUNCHER), *args[:-2], "-MD", "-MT", obj, "-MF", obj + ".d",
                        "-o", obj], cwd=tree, capture_output=True, text=True, env=env)
    return tree, src, args, p, env


with tempfile.TemporaryDirectory() as d:
    tree, src, args, p, env = kept_tree(d, sample)
    kept = tree / "CMakeFiles/pagedkv_cuda.dir/kernels/fake_attention.cu.o.device"
    expect(p.returncode == 0, f"launcher: the compile passes: {p.returncode} {p.stderr}")
    expect("warning #177-D" in p.stderr and "ptxas info" not in p.stderr
           and "bytes stack frame" not in p.stderr,
           f"launcher: the warning printed, ptxas's resource lines not: {p.stderr[:400]}")
    expect(sorted(f.name for f in kept.iterdir()) ==
           ["command", "deps", "fake_attention.ptx", "fake_attention.sm_90.cubin", "nvcc-version",
            "ptxas.log"],
           f"launcher: kept PTX, cubin, command and log, not the host intermediates: "
           f"{sorted(f.name for f in kept.iterdir())}")
    expect((kept / "ptxas.log").read_text().startswith(sample[:40]),
           "launcher: ptxas.log holds nvcc's whole output")
    expect((kept / "command").read_bytes().split(b"\0")[0] == args[0].encode(),
           "launcher: the command file starts with the compiler, without the launcher")
    got, why = kr.kept_device_code(str(src), str(tree), args, args[0])
    expect(got is not None and got[0].startswith(sample[:40])
           and got[2].name == "fake_attention.sm_90.cubin" and kr.parse_ptx_block_sizes(got[1]),
           f"kept_device_code reads a complete, current folder: {why}")
    # The report reads it: the stand-in nvcc fails any compile, so a pass compiled nothing.
    out = pathlib.Path(d) / "out"
    q = subprocess.run([sys.executable, str(SCRIPT), "report", str(tree), str(out), "--jobs", "1"],
                       capture_output=True, text=True, env=env)
    md = (out / "kernel-resources.md").read_text() if (out / "kernel-resources.md").exists() else ""
    expect(q.returncode == 0 and "1 sources as the build compiled them" in md
           and "paged_extend_kernel<Fp16Mma, 256>" in md,
           f"report from kept code: exit {q.returncode}: {q.stdout + q.stderr}")
    # With a disassembler (a stand-in that records which cubin it was given and prints one
    # function's SASS): the kept cubin is disassembled and its counts reach that kernel's row.
    copy_blocks = next(f["mangled"] for f in kr.parse_ptxas(sample)
                       if "copy_blocks_kernel" in f["mangled"])
    fake_nvdisasm = pathlib.Path(d) / "nvdisasm"
    fake_nvdisasm.write_text(f"""#!/usr/bin/env bash
if [ "$1" = --version ]; then echo "Cuda compilation tools, release 11.8, V11.8.0"; exit 0; fi
printf '%s\\n' "${{@: -1}}" >>"{d}/nvdisasm-args"
echo "//--------------------- .text.{copy_blocks} --------------------------"
for i in 1 2 3; do echo "        /*00${{i}}0*/                   HMMA.16816.F32 R0, R2, R4, R0 ;"; done
echo "        /*0040*/                   LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;"
""")
    fake_nvdisasm.chmod(0o755)
    q = subprocess.run([sys.executable, str(SCRIPT), "report", str(tree), str(out), "--jobs", "1",
                        "--nvdisasm", str(fake_nvdisasm)], capture_output=True, text=True, env=env)
    report = json.loads((out / "kernel-resources.json").read_text()) if q.returncode in (0, 1) \
        else {}
    rows = {r["mangled"]: r for r in report.get("kernels", [])}
    sass = (rows.get(copy_blocks) or {}).get("sass") or {}
    disassembled = (pathlib.Path(d) / "nvdisasm-args").read_text().split() \
        if (pathlib.Path(d) / "nvdisasm-args").exists() else []
    # (The SASS rules then fail the sample's tensor-core kernels, absent from this disassembly.)
    expect(q.returncode == 1 and "not found in the disassembly" in q.stdout + q.stderr
           and disassembled == [str(kept / "fake_attention.sm_90.cubin")]
           and sass.get("counts", {}).get("HMMA") == 3 and sass["counts"].get("LDGSTS") == 1
           and "cubins read as compiled" in (out / "kernel-resources.md").read_text(),
           f"kept cubin disassembled, its counts on the kernel's row: exit {q.returncode}, "
           f"{disassembled}, {sass}, {q.stderr[-300:]}")
    q = subprocess.run([sys.executable, str(SCRIPT), "report", str(tree), str(out), "--jobs", "1",
                        "--compile"], capture_output=True, text=True, env=env)
    expect(q.returncode == 2 and "asked to compile again" in q.stdout + q.stderr,
           f"report --compile compiles (the stand-in refuses): {q.returncode} {q.stderr[-300:]}")

    # Each way the folder cannot be trusted makes the report compile instead, and says why.
    def refused(expect_why, what):
        got, why = kr.kept_device_code(str(src), str(tree), args, args[0])
        expect(got is None and why is not None and expect_why in why, f"{what}: {why}")

    objp = tree / "CMakeFiles/pagedkv_cuda.dir/kernels/fake_attention.cu.o"
    t = (kept / "ptxas.log").stat().st_mtime
    os.utime(objp, (t + 10, t + 10))
    refused("older than its object", "an object rebuilt without the launcher")
    os.utime(objp, (t, t))
    os.utime(src, (t + 10, t + 10))
    refused("older than its source", "a source changed since the build")
    os.utime(src, (t - 10, t - 10))
    expect(kr.depfile_paths((kept / "deps").read_text())[-1].endswith("tiles.cuh"),
           f"launcher: the dependency list kept: {(kept / 'deps').read_text()!r}")
    header = src.parent / "inc" / "tiles.cuh"
    os.utime(header, (t + 10, t + 10))
    refused("older than a file it was compiled from", "a header in its dependency list changed")
    os.utime(header, (t - 10, t - 10))
    # Without a dependency list its headers cannot be checked.
    deps_text = (kept / "deps").read_text()
    (kept / "deps").unlink()
    refused("no dependency list kept", "no dependency list")
    (kept / "deps").write_text(deps_text.replace("tiles.cuh", "gone.cuh"))
    os.utime(kept / "ptxas.log", (t, t))
    refused("older than a file it was compiled from", "a dependency that no longer exists")
    (kept / "deps").write_text(deps_text)
    os.utime(kept / "ptxas.log", (t, t))
    got, why = kr.kept_device_code(str(src), str(tree), args, args[0])
    expect(got is not None, f"current again with its dependency list: {why}")
    version = (kept / "nvcc-version").read_text()
    (kept / "nvcc-version").write_text(version.replace("99.9", "99.8"))
    refused("another version", "kept by another version of the compiler")
    (kept / "nvcc-version").write_text(version)
    os.utime(kept / "ptxas.log", (t, t))
    two = [a.replace("code=[compute_90,sm_90]", "code=[sm_90,sm_90a]") for a in args]
    got, why = kr.kept_device_code(str(src), str(tree), two, args[0])
    expect(got is None and "more than one real architecture" in why, f"two architectures: {why}")
    got, why = kr.kept_device_code(str(src), str(tree), args[:1] + ["-O2"] + args[2:], args[0])
    expect(got is None and "other flags" in why, f"other flags than the tree lists: {why}")
    got, why = kr.kept_device_code(str(src), str(tree), args, sys.executable)
    expect(got is None and "compiled by" in why, f"another compiler: {why}")
    (kept / "fake_attention.sm_90.cubin").rename(kept / "moved")
    refused("no sm_90 cubin", "a missing cubin")
    (kept / "moved").rename(kept / "fake_attention.sm_90.cubin")
    cmd_bytes = (kept / "command").read_bytes()
    (kept / "command").write_bytes(cmd_bytes[:-1])
    refused("malformed", "a command file cut short")
    (kept / "command").write_bytes(cmd_bytes)
    (kept / "ptxas.log").unlink()
    refused("not kept", "no ptxas.log (an interrupted compile)")
    # The report then compiles, and names the reason in its header.
    q = subprocess.run([sys.executable, str(SCRIPT), "report", str(tree), str(out), "--jobs", "1"],
                       capture_output=True, text=True, env=env)
    expect(q.returncode == 2 and "asked to compile again" in q.stdout + q.stderr,
           f"report without a complete folder compiles: {q.returncode} {q.stderr[-300:]}")

    # A failing compile: its exit status and its errors come through, and no folder is left.
    env_fail = dict(env, FAKE_NVCC_FAIL="1")
    p = subprocess.run([str(LAUNCHER), *args], cwd=tree, capture_output=True, text=True,
                       env=env_fail)
    expect(p.returncode == 3 and "broken on purpose" in p.stderr and not kept.exists(),
           f"launcher: a failed compile exits 3, prints its error, leaves no folder: "
           f"{p.returncode} {p.stderr} {kept.exists()}")
    # A launcher in front answering from its cache (nvcc did not run: no cubin): nothing kept, the
    # compile still passes.
    p = subprocess.run([str(LAUNCHER), *args], cwd=tree, capture_output=True, text=True,
                       env=dict(env, FAKE_CACHE_HIT="1"))
    expect(p.returncode == 0 and not kept.exists(),
           f"launcher: a cache hit keeps nothing and passes: {p.returncode} {kept.exists()}")
    # Another launcher in front of nvcc (env here): the kept command still reads as nvcc's.
    obj = args[-1]
    p = subprocess.run([str(LAUNCHER), "env", "X=1", *args[:-2], "-MD", "-MT", obj, "-MF",
                        obj + ".d", "-o", obj], cwd=tree, capture_output=True, text=True, env=env)
    got, why = kr.kept_device_code(str(src), str(tree), args, args[0])
    expect(p.returncode == 0 and got is not None,
           f"launcher behind env: kept and read as nvcc's compile: {p.returncode} {why}")
    # A command without -o runs as it is (nothing kept).
    p = subprocess.run([str(LAUNCHER), args[0], "--version"], capture_output=True, text=True)
    expect(p.returncode == 0 and "release 99.9" in p.stdout, f"launcher without -o: {p.stdout}")

# One architecture alone: nvcc names the cubin STEM.cubin.
with tempfile.TemporaryDirectory() as d:
    tree, src, args, p, env = kept_tree(d, sample)
    kept = tree / "CMakeFiles/pagedkv_cuda.dir/kernels/fake_attention.cu.o.device"
    (kept / "fake_attention.sm_90.cubin").rename(kept / "fake_attention.cubin")
    one = [a.replace("code=[compute_90,sm_90]", "code=sm_90") for a in args]
    cmd = [a.replace("code=[compute_90,sm_90]", "code=sm_90")
           for a in (kept / "command").read_bytes().decode().split("\0")[:-1]]
    (kept / "command").write_bytes(b"".join(a.encode() + b"\0" for a in cmd))
    os.utime(kept / "ptxas.log")
    got, why = kr.kept_device_code(str(src), str(tree), one, args[0])
    expect(got is not None and got[2].name == "fake_attention.cubin",
           f"one architecture: STEM.cubin is its cubin: {why}")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("kernel-resources: all checks passed")
