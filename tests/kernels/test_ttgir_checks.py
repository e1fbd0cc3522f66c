"""`pipeline_hazards` on TTGIR excerpts shaped like the mLSTM output kernel's before and after the
ninth session's fix (runs everywhere; the compile tests apply it to every kernel for sm_90)."""

from __future__ import annotations

from bench.ttgir_checks import pipeline_hazards

RACY = """
    %b_q_67 = ttg.local_alloc : () -> !ttg.memdesc<1x64x64xbf16, #shared, #smem, mutable>
    %b_kT_68 = ttg.local_alloc : () -> !ttg.memdesc<2x64x64xbf16, #shared1, #smem, mutable>
      %b_q_204 = ttg.memdesc_index %b_q_67[%c0_i32] : !ttg.memdesc<1x64x64xbf16>
      %b_kT_206 = ttg.memdesc_index %b_kT_68[%i] : !ttg.memdesc<2x64x64xbf16>
      %out_211 = ttng.warp_group_dot %b_q_204, %b_kT_206, %acc {inputPrecision = 0 : i32, isAsync = true}
      %out_212:3 = ttng.warp_group_dot_wait %out_211, %b_q_204, %b_kT_206 {pendings = 2 : i32}
      %b_q_241 = ttg.async_copy_global_to_local %ptrs, %b_q_204 mask %m
"""


def test_single_buffered_async_operand_with_pending_dots_is_flagged():
    assert pipeline_hazards(RACY) == [("%b_q_67", 1, [2])]


def test_double_buffered_operand_is_not():
    fixed = RACY.replace(
        "memdesc<1x64x64xbf16, #shared, #smem, mutable>", "memdesc<2x64x64xbf16, #shared, #smem, mutable>"
    )
    assert pipeline_hazards(fixed) == []


def test_waits_that_drain_every_dot_are_not():
    assert pipeline_hazards(RACY.replace("pendings = 2", "pendings = 0")) == []


def test_synchronous_dots_are_not():
    assert pipeline_hazards(RACY.replace(", isAsync = true", "")) == []
