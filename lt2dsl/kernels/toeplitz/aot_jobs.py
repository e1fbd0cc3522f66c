"""sm_90 compile jobs of the Toeplitz mixer (`common.aot`): the blocked-DFT passes (bf16 x, the
`tmm` example's 1024 channels in 4 heads at T = 2048, the block size `block_size` picks), pass 2's
forward and adjoint products of each recipe (`recipe.RECIPES`: from the precomputed tiles, and
gathered from the packed spectra), every autotune config its pruner keeps for those heads; the FFT
path's and the decode step's kernels at their fixed launches."""

from __future__ import annotations

from lt2dsl.kernels.common.aot import Job, tuned_jobs
from lt2dsl.kernels.toeplitz import blocked as Bk
from lt2dsl.kernels.toeplitz import decode as Dec
from lt2dsl.kernels.toeplitz import fft_fast as Fft
from lt2dsl.kernels.toeplitz.blocked_ref import block_size
from lt2dsl.kernels.toeplitz.recipe import RECIPES, TILE

T, C, HEADS, KW = 2048, 1024, 4, 1
S = block_size(T)
INTS = ("T", "M", "C", "CH", "B", "HEADS", "NSPLIT", "NT", "n", "n_bias", "s_b", "s_r", "s_J", "N", "F", "t",
        "S_PER")  # fmt: skip
SCALARS = {n: "i32" for n in INTS}
SHAPE = {"C": C, "CH": C // HEADS}  # what the column pruner reads


def _jobs(name, kernel, ptrs, cex, launch=None) -> list[Job]:
    return tuned_jobs(f"toeplitz/{name}", kernel, ptrs, SCALARS, cex, values=SHAPE, launch=launch, aligned=(),
                      default_ptr="*bf16")  # fmt: skip


def _blocked() -> list[Job]:
    f32 = "*fp32"
    out = _jobs("window_dft", Bk.window_dft_kernel, {"w": f32, "F2": f32, "V": f32}, dict(S=S, BR=64, BD=32),
                launch=(4, 3))  # fmt: skip
    out += _jobs("spectra", Bk.spectra_kernel, {}, dict(S=S))
    for has_bias in (True, False):
        cex = dict(S=S, HAS_BIAS=has_bias, **({} if has_bias else {"bias": None}))
        out += _jobs(f"samples-b{has_bias:d}", Bk.samples_kernel, {"bias": f32}, cex)
    for pass2 in sorted({r.pass2 for r in RECIPES.values()}):
        out += _pass2(pass2)
    return out + _jobs("corr", Bk.corr_kernel, {"dV": f32}, dict(S=S))


def _pass2(pass2: str) -> list[Job]:
    """Pass 2 forward and adjoint: from the tiles (and the kernel making them) or gathered."""
    if pass2 == "gather":
        return [j for t in (0, 1) for j in _jobs(f"mix-t{t}", Bk.mix_kernel, {}, dict(S=S, TRANSPOSE=t == 1))]
    out = _jobs("tiles", Bk.tiles_kernel, {"V": "*fp32"}, dict(S=S, BT=TILE), launch=(4, 3))
    for t in (0, 1):
        out += _jobs(f"mix_tiles-t{t}", Bk.mix_tiles_kernel, {}, dict(S=S, BT=TILE, TRANSPOSE=t == 1))
    return out


def _fft_and_decode() -> list[Job]:
    """`fft_fast` (fp32 spectra, complex values as real pairs) and `decode.step_kernel`."""
    f32 = "*fp32"
    ch = dict(C=C, CH=C // HEADS)
    out = _jobs("fft_pad", Fft.pad_transpose_kernel, {"out": f32}, dict(C=C, BT=Fft.BLOCK_T, BC=Fft.BLOCK_C),
                launch=(4, 3))  # fmt: skip
    unpad = dict(ch, BT=Fft.BLOCK_T, BC=Fft.BLOCK_C, HAS_BIAS=True)
    out += _jobs("fft_unpad", Fft.unpad_transpose_kernel, {"y": f32, "bias": f32}, unpad, launch=(4, 3))
    spec = dict(ch, HEADS=HEADS, KW=KW, BF=Fft.BLOCK_F)
    for adjoint in (False, True):
        out += _jobs(f"fft_mix-a{adjoint:d}", Fft.mix_kernel, {"X": f32, "W": f32, "Y": f32},
                     dict(spec, ADJOINT=adjoint), launch=(4, 3))  # fmt: skip
    out += _jobs("fft_dw", Fft.dw_kernel, {"DY": f32, "X": f32, "DW": f32}, spec, launch=(4, 3))
    step = dict(ch, HEADS=HEADS, KW=KW, BS=Dec.BLOCK_S, BC=Dec.BLOCK_C)
    return out + _jobs("decode_step", Dec.step_kernel, {"w": f32, "part": f32}, step, launch=(4, 3))


def jobs() -> list[Job]:
    return _blocked() + _fft_and_decode()
