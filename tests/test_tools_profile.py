"""The tools that read what the profiler and the compiler report: ``tools/hopper_profile.py`` (its
CPU dry run, and Nsight Compute CSVs and ptxas logs summarized), ``tools/sass_loops.py`` (the loops
of a SASS listing) and ``tools/hopper_aot.py`` (ptxas output), on CPU.

The scripts are imported from ``tools/`` by the ``bench`` fixture (conftest.py). Speed is measured
on the device, never here: these tests only keep the scripts from rotting.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip

import numpy as np
import pytest


def test_hopper_profile_durations_per_kernel(bench, tmp_path):
    """``hopper_profile.py --durations``: each kernel's Duration from an ncu details CSV (plain or
    gzipped) in launch order, converted to microseconds, other metrics ignored; no Duration rows or
    an unknown unit are ValueErrors."""
    hp = bench("hopper_profile")
    head = ["ID", "Kernel Name", "Grid Size", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
    rows = [
        ["0", "loop_broadcast_fusion", "(131072, 1, 1)", "SOL", "Duration", "usecond", "81.25"],
        ["0", "loop_broadcast_fusion", "(131072, 1, 1)", "SOL", "SM Frequency", "Ghz", "1.96"],
        ["1", "scoped_mosaic_gpu_kernel", "(1, 128, 32)", "SOL", "Duration", "msecond", "9.57"],
        ["2", "convert_dq", "(1024, 1, 32)", "SOL", "Duration", "ns", "103,040"],
    ]
    path = tmp_path / "k.csv.gz"
    path.write_bytes(
        gzip.compress(("\n".join(",".join(f'"{x}"' for x in r) for r in [head, *rows]) + "\n").encode())
    )
    kernels = hp.main(["--durations", str(path)])["durations"]
    assert [k["id"] for k in kernels] == [0, 1, 2]
    assert [k["kernel"] for k in kernels] == [
        "loop_broadcast_fusion",
        "scoped_mosaic_gpu_kernel",
        "convert_dq",
    ]
    assert [round(k["us"], 2) for k in kernels] == [81.25, 9570.0, 103.04]
    assert kernels[1]["grid"] == "(1, 128, 32)"
    table = hp.durations_table(kernels)
    assert table.splitlines()[-1].split() == ["total", "9754.3", "us"]
    rows[0][5] = "cycle"
    path.write_bytes(
        gzip.compress(("\n".join(",".join(f'"{x}"' for x in r) for r in [head, *rows]) + "\n").encode())
    )
    with pytest.raises(ValueError, match="unit 'cycle'"):
        hp.durations(str(path))
    plain = tmp_path / "none.csv"
    plain.write_text(",".join(head) + "\n")
    with pytest.raises(ValueError, match="no Duration rows"):
        hp.durations(str(plain))


def test_hopper_profile_runs_the_steps_once_and_summarizes_ncu_csv(bench, tmp_path):
    """``hopper_profile.py``: a CPU dry run (interpret mode) of the calls it gives the profiler, and
    ``--summarize`` of an ncu details CSV, plain or gzipped (one column per kernel, rules by
    estimated speedup); bad shapes and empty CSVs are ValueErrors."""
    hp = bench("hopper_profile")
    out = hp.main(["--shape", "2:1:64", "--seq", "128", "--interpret"])
    o, (dq, dk, dv) = out["pallas_hopper"]
    assert o.shape == dq.shape == (1, 128, 2, 64) and dk.shape == dv.shape == (1, 128, 1, 64)
    assert all(np.isfinite(np.asarray(g)).all() for g in (o, dq, dk, dv)) and "cudnn" not in out
    assert "softcap" not in out
    capped = hp.main(
        ["--shape", "2:1:64", "--seq", "128", "--causal", "1", "--softcap", "0.5", "--interpret"]
    )
    o2, g2 = capped["softcap"]
    # the capped step is causal attention over 0.5 * tanh(logits / 0.5) (float64 here; the kv head
    # is shared by both query heads)
    q, k, v, _ = (np.asarray(x, np.float64) for x in hp.inputs(128, 2, 1, 64))
    s = 0.5 * np.tanh(np.einsum("qhd,kd->hqk", q[0], k[0, :, 0]) * 64**-0.5 / 0.5)
    s = np.where(np.tril(np.ones((128, 128), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = np.einsum("hqk,kd->qhd", p / p.sum(-1, keepdims=True), v[0, :, 0])
    assert np.abs(np.asarray(o2[0], np.float64) - want).max() < 2e-2 * np.abs(want).max()
    assert all(np.isfinite(np.asarray(g)).all() for g in g2)
    with pytest.raises(ValueError, match="--softcap -1.0: must be positive"):
        hp.main(["--shape", "2:1:64", "--seq", "128", "--softcap", "-1", "--interpret"])
    head = [
        "ID",
        "Kernel Name",
        "Section Name",
        "Metric Name",
        "Metric Unit",
        "Metric Value",
        "Rule Name",
        "Rule Description",
        "Estimated Speedup",
    ]
    rows = [
        ["0", "fwd_kernel", "SOL", "Duration", "ms", "107.00", "", "", ""],
        ["0", "fwd_kernel", "Mem", "Local Memory Spilling Requests", "", "0", "", "", ""],
        ["1", "bwd_kernel", "SOL", "Duration", "ms", "338.84", "", "", ""],
        ["1", "bwd_kernel", "Warp", "", "", "", "CPIStall", "3.2  cycles  stalled", "28.2"],
        ["1", "bwd_kernel", "Mem", "", "", "", "MemoryCacheAccessPattern", "local loads", "69.6"],
        ["1", "bwd_kernel", "Compute", "", "", "", "HighPipeUtilization", "Shared 58.8%", ""],
    ]
    path = tmp_path / "prof.csv"
    path.write_text("\n".join(",".join(f'"{x}"' for x in r) for r in [head, *rows]) + "\n")
    text = hp.main(["--summarize", str(path)])["summary"]
    lines = text.splitlines()
    assert "0:fwd_kernel" in lines[0] and "1:bwd_kernel" in lines[0]
    assert "107.00 ms" in lines[1] and "338.84 ms" in lines[1]
    bwd = lines[lines.index("1:bwd_kernel") :]
    assert bwd[1].startswith("  HighPipeUtilization (-): Shared 58.8%")
    assert bwd[2].startswith("  MemoryCacheAccessPattern (69.6%)") and "(28.2%)" in bwd[3]
    assert "3.2 cycles stalled" in bwd[3]
    packed = tmp_path / "prof.csv.gz"  # profiles are often kept gzipped
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert hp.summarize(str(packed)) == text
    path.write_text(",".join(head) + "\n")
    with pytest.raises(ValueError, match="no kernel rows"):
        hp.summarize(str(path))
    with pytest.raises(ValueError, match="heads=3 must be a positive multiple of kv_heads=2"):
        hp.parse_shape("3:2:64")


def test_hopper_profile_backward_takes_hopper_checks_variant_entries(bench):
    """``--backward`` is a ``hopper_check.py --backwards`` entry: a name, then BlockSizes fields."""
    hp = bench("hopper_profile")
    default = hp.block_sizes(128, "default", causal=False)
    assert default == hp.ph.default_block_sizes(128, causal=False)
    assert hp.block_sizes(128, "default/bwd_stages=3") == dataclasses.replace(
        hp.ph.default_block_sizes(128), bwd_stages=3
    )
    mosaic = hp.block_sizes(64, "mosaic/bwd_block_k=128/registers=232")
    assert (mosaic.backward, mosaic.bwd_block_k, mosaic.registers) == ("mosaic", 128, 232)
    assert hp.block_sizes(64, "deterministic") == hp.ph.deterministic_block_sizes(None, 64)
    with pytest.raises(ValueError, match="'cudnn/bwd_stages=3': must start with"):
        hp.block_sizes(128, "cudnn/bwd_stages=3")


def test_hopper_profile_sass_shares_stall_samples_by_opcode_reason_and_line(bench, tmp_path):
    """``--sass`` of an ncu source-page CSV (gzipped, with ncu's "Kernel Name" line before the
    header): sample shares per opcode (predicates and modifiers stripped) and per stall reason, the
    instructions ranked by samples, then per execution count (a loop body's instructions share
    one); a CSV without the samples column is a ValueError."""
    hp = bench("hopper_profile")
    head = [
        "Address",
        "Source",
        hp.SAMPLES,
        "Warp Stall Sampling (Not-issued Samples)",
        "Instructions Executed",
        "stall_barrier",
        "stall_long_sb",
        "stall_long_sb (Not Issued)",
    ]
    rows = [
        ["0x10", "@!P1  BRA 0x40", "600", "500", "16", "0", "600", "500"],
        ["0x20", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "300", "200", "32", "300", "0", "0"],
        ["0x30", "@P0 BRA 0x10", "100", "50", "32", "100", "0", "0"],
        ["0x40", "EXIT", "0", "0", "1", "0", "0", "0"],
    ]
    path = tmp_path / "sass.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write('"Kernel Name","scoped_mosaic_gpu_kernel",\n')
        csv.writer(f).writerows([head, *rows])
    lines = hp.main(["--sass", str(path)])["sass"].splitlines()
    assert lines[0] == "4 instructions, 1000 stall samples"
    assert lines[1] == "by opcode: BRA 70.0%, WARPGROUP 30.0%, EXIT 0.0%"
    assert lines[2] == "by reason: long_sb 60.0%, barrier 40.0%"
    assert lines[4].split() == ["600", "60.0%", "16", "@!P1", "BRA", "0x40"]
    assert lines[5].split()[:3] == ["300", "30.0%", "32"]
    assert lines[8:] == [
        "by execution count (the instructions of one loop body ran equally often):",
        "  ran 16: 1 instructions, 60.0% of the samples (long_sb 100%)",
        "  ran 32: 2 instructions, 40.0% of the samples (barrier 100%)",
    ]
    plain = tmp_path / "details.csv"
    plain.write_text('"ID","Kernel Name"\n"0","k"\n')
    with pytest.raises(ValueError, match="no 'Warp Stall Sampling"):
        hp.sass_summary(str(plain))
    plain.write_text(",".join(head) + "\n" + ",".join(rows[0][:-1]) + "\n")
    with pytest.raises(ValueError, match="1 rows .* do not have the header's 8 columns"):
        hp.sass_summary(str(plain))


def test_hopper_profile_sass_prices_the_hottest_loop_per_opcode(bench, tmp_path):
    """With ncu's ``stall_selected`` column, ``--sass`` ends with the hottest loop body's warp
    cycles per instruction by opcode: an instruction's samples over the median selected samples of
    the body's instructions (MUFU keeps its function: EX2 and TANH apart). Made-up samples: a
    tanh its warp waits 7 issues at, an exp2 8, a multiply issued at once, a spin 20; a colder
    body (ran 8) is not priced."""
    hp = bench("hopper_profile")
    head = ["Source", hp.SAMPLES, "Instructions Executed", "stall_selected", "stall_wait"]
    rows = [
        ["MUFU.TANH R1, R1", "70", "64", "10", "60"],
        ["MUFU.EX2 R2, R2", "80", "64", "10", "70"],
        ["FMUL R3, R3, 0.5", "10", "64", "10", "0"],
        ["FMUL R4, R4, 0.5", "10", "64", "10", "0"],
        ["@!P1 BRA 0x40", "200", "64", "10", "190"],
        ["EXIT", "50", "8", "1", "49"],
    ]
    path = tmp_path / "sass.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([head, *rows])
    last = hp.main(["--sass", str(path)])["sass"].splitlines()[-1]
    assert last == (
        "hottest loop (ran 64, 5 instructions), warp cycles: "
        "BRA 1 x 20.0, MUFU.EX2 1 x 8.0, MUFU.TANH 1 x 7.0, FMUL 2 x 1.0"
    )


def test_hopper_profile_pipes_per_kernel_from_the_raw_page(bench, tmp_path):
    """``--pipes`` of ncu's raw page (gzipped; a units row under the header, then a row per
    kernel): each kernel's busy share per pipe in ``PIPES``' order; a CSV without those metrics
    (another section set) is a ValueError naming them."""
    hp = bench("hopper_profile")
    head = ["ID", "Kernel Name", "gpu__time_duration.sum", *hp.PIPES.values()]
    units = ["", "", "ms", *["%"] * len(hp.PIPES)]
    rows = [
        ["0", "anonymous_mosaic_gpu_kernel", "12.9", "72.8", "37.6", "11.4", "17.1", "8.6", "2.4"],
        ["1", "anonymous_mosaic_gpu_kernel", "14.9", "60.8", "61.8", "13.1", "14.6", "7.1", "2.0"],
    ]
    path = tmp_path / "raw.csv.gz"
    with gzip.open(path, "wt", newline="") as f:
        csv.writer(f).writerows([head, units, *rows])
    lines = hp.main(["--pipes", str(path)])["pipes"].splitlines()
    assert lines[0].split() == ["kernel", "tensor", "xu", "(MUFU)", "fma", "alu", "uniform", "lsu"]
    assert lines[2].split() == [
        "1:anonymous_mosaic_gpu_kern",
        "60.8%",
        "61.8%",
        "13.1%",
        "14.6%",
        "7.1%",
        "2.0%",
    ]
    assert len(lines) == 3
    plain = tmp_path / "details.csv"
    plain.write_text('"ID","Kernel Name"\n"","" \n')
    with pytest.raises(ValueError, match="sm__pipe_tensor_cycles_active"):
        hp.pipes(str(plain))


def test_hopper_profile_ptxas_reads_registers_and_spills_per_kernel(bench, tmp_path):
    """``--ptxas`` of a run's output with ``MOSAIC_GPU_DUMP_PTXAS=1`` (gzipped; the ptxas lines as
    jaxlib 0.11.2 printed them on an H200, with its failed SASS dump after the first kernel; the
    SASS lines after the second are made up, in nvdisasm's format, since that machine has no
    nvdisasm): per kernel in compile order its name, registers, stack and spill bytes, and the
    LDL/STL count of any SASS after it; a log without ptxas lines is a ValueError."""
    hp = bench("hopper_profile")
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'anonymous_mosaic_gpu_kernel' for 'sm_90a'
ptxas info    : Function properties for anonymous_mosaic_gpu_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 16 barriers, 1 bytes smem
nvdisasm invocation failed: INTERNAL: Process spawn failed: No such file or directory
ptxas warning : Registers are spilled to local memory in function 'scoped_mosaic_gpu_kernel'
ptxas info    : Compiling entry function 'scoped_mosaic_gpu_kernel' for 'sm_90a'
ptxas info    : Function properties for scoped_mosaic_gpu_kernel
    200 bytes stack frame, 296 bytes spill stores, 336 bytes spill loads
ptxas info    : Used 168 registers, used 16 barriers, 200 bytes cumulative stack size
        /*0100*/                   STL.64 [R1+0x8], R4 ;
        /*0110*/                   LDL.64 R4, [R1+0x8] ;
        /*0120*/                   LDL R6, [R1] ;
        /*0130*/                   LDS R7, [R2] ;
"""
    path = tmp_path / "ptxas.log.gz"
    with gzip.open(path, "wt") as f:
        f.write(log)
    fwd, bwd = hp.main(["--ptxas", str(path)])["ptxas"]
    assert fwd == {
        "kernel": "anonymous_mosaic_gpu_kernel",
        "registers": 168,
        "stack_bytes": 0,
        "spill_store_bytes": 0,
        "spill_load_bytes": 0,
        "sass_LDL": 0,
        "sass_STL": 0,
    }
    assert bwd == {
        "kernel": "scoped_mosaic_gpu_kernel",
        "registers": 168,
        "stack_bytes": 200,
        "spill_store_bytes": 296,
        "spill_load_bytes": 336,
        "sass_LDL": 2,
        "sass_STL": 1,
    }
    plain = tmp_path / "plain.log"
    plain.write_text("profiled L=1024\n")
    with pytest.raises(ValueError, match='no "Compiling entry function" line'):
        hp.ptxas_summary(str(plain))


# A made-up listing in nvdisasm's form: a two-trip loop (its latch a conditional forward exit and an
# unconditional backward branch) holding tensor-core work and a spill reload, an out-of-line
# mbarrier retry stub that jumps back into it, and a spin loop with no HGMMA.
SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R2+URZ], R3 ;
        /*0020*/              @!P1 BRA `(.L_x_9) ;
.L_x_2:
        /*0030*/                   LDL.64 R20, [R1+0x8]                   (*"SpillRefill"*);
        /*0040*/                   WARPGROUP.ARRIVE ;
        /*0050*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;
        /*0060*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24, gsb0 ;
        /*0070*/                   STL [R1+0x4], R9                       (*"SpillRefill"*);
        /*0080*/                   BAR.SYNC.DEFER_BLOCKING R224, 0x80 ;
        /*0090*/              @!P2 BRA `(.L_x_3) ;
        /*00a0*/                   BRA `(.L_x_1) ;
.L_x_3:
        /*00b0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P3, [R4+URZ], R5 ;
        /*00c0*/              @!P3 BRA `(.L_x_3) ;
        /*00d0*/                   EXIT ;
.L_x_9:
        /*00e0*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R2+URZ], R3 ;
        /*00f0*/              @!P1 BRA `(.L_x_9) ;
        /*0100*/                   BRA `(.L_x_2) ;
"""


def test_sass_loops_counts_what_a_loop_pays_per_trip(bench):
    sass_loops = bench("sass_loops")
    (loop,) = sass_loops.loops(SASS)  # not the retry stub's jump back, not the spin loop
    assert (loop.start, loop.end) == (0x10, 0xA0)
    assert (loop.instructions, loop.hgmma, loop.ldl, loop.stl, loop.bar) == (10, 2, 1, 1, 2)
    mix = dict(sass_loops.opcode_mix(SASS, loop))
    assert mix["HGMMA"] == 2 and mix["BRA"] == 3 and mix["LDL"] == 1 and sum(mix.values()) == 10
    head, row = sass_loops.summary(SASS)
    assert head == "17 instructions, 2 HGMMA, 1 LDL, 1 STL in the whole kernel"
    assert row == "loop 0x0010-0x00a0: 10 instructions, 2 HGMMA, 1 LDL, 1 STL, 2 barrier ops"


def test_hopper_aot_reads_ptxas_output(bench):
    log = (
        "ptxas info    : Function properties for scoped_mosaic_gpu_kernel\n"
        "    200 bytes stack frame, 296 bytes spill stores, 336 bytes spill loads\n"
        "ptxas info    : Used 168 registers, used 16 barriers, 200 bytes cumulative stack size\n"
    )
    log += (
        "ptxas warning : (C7519) warpgroup.arrive is injected in around line 9 by "
        "compiler to allow use of registers in GMMA in function 'k'\n"
    )
    assert bench("hopper_aot").ptxas_info(log) == dict(
        registers=168, spill_stores=296, spill_loads=336, stack_frame=200, wgmma_notes=1, serialized=[]
    )
    assert bench("hopper_aot").ptxas_info("")["registers"] is None
    log += (
        "ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are "
        "serialized due to insufficient register resources for the function 'k'\n"
    )
    assert bench("hopper_aot").ptxas_info(log)["serialized"] == ["C7512"]
