"""Run one input through the CLI, or one accepted program through its lowered model.

`run_cli(argv, data)` calls `lt2dsl` in-process on a file holding `data` and classifies what
happened: an exit code, an internal error (E9999 or a traceback), or an exception that escaped
`main`. `run_model(text)` compiles an accepted program on the reference backend in fp32, runs a
forward and a backward (every output and gradient must be finite) and a prefill followed by
single-token decode steps through one cache, which must equal the forward within 1e-4.

Where fp32 decode and forward differ by more, the model is run again in float64. Some
programs are ill-conditioned at their random initialisation: a sandwich norm, or a final norm
after every iteration, adds a branch of the same size as the residual, and a mixer that scales
its input (a one-head, one-tap `tmm` at the first position) can make the branch its negative,
so the sum is rounding noise that the next norm amplifies. Their fp32 forward is then itself far
from the float64 forward, and no implementation could make fp32 decode agree to 1e-4. Such a
program passes when it is ill-conditioned (fp32 forward off the float64 forward by more than
1e-5) and its float64 decode equals its float64 forward within 1e-8: a cache or decode bug
cannot hide there.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import tempfile
from dataclasses import dataclass

# A program is run over this many tokens (fewer when its max_len is shorter), its first
# PREFILL of them as one prefill and the rest one token at a time.
SEQ, PREFILL, BATCH = 10, 4, 2
# Decode must equal the forward to this relative error, max |a − b| / max |b| (fp32).
DECODE_RTOL = 1e-4
# An fp32 forward this far from the float64 forward cannot resolve DECODE_RTOL; its float64
# decode must then equal its float64 forward within EXACT_RTOL.
ILL_CONDITIONED, EXACT_RTOL = 1e-5, 1e-8


@dataclass(frozen=True)
class CliOutcome:
    status: int | None  # None: an exception escaped `main`
    stderr: str
    escaped: str = ""

    @property
    def internal(self) -> bool:
        return self.status == 3 or "E9999" in self.stderr or "Traceback" in self.stderr or bool(self.escaped)


@dataclass(frozen=True)
class RunOutcome:
    finite: bool
    grads_finite: bool
    decode_error: float  # max |decode − forward| / max |forward|, fp32
    error: str = ""  # an exception raised by compile or run
    # measured only when decode_error > DECODE_RTOL: the fp32 forward against the float64 one,
    # and the float64 decode against the float64 forward
    forward_error: float | None = None
    decode_error_fp64: float | None = None

    @property
    def ill_conditioned(self) -> bool:
        """fp32 cannot resolve this model's output, and its float64 decode is exact."""
        return (
            self.forward_error is not None
            and self.forward_error > ILL_CONDITIONED
            and self.decode_error_fp64 is not None
            and self.decode_error_fp64 <= EXACT_RTOL
        )

    @property
    def decodes_as_it_runs(self) -> bool:
        return self.decode_error <= DECODE_RTOL or self.ill_conditioned

    @property
    def ok(self) -> bool:
        return not self.error and self.finite and self.grads_finite and self.decodes_as_it_runs


def run_cli(argv: list[str], data: bytes, workdir: str | None = None) -> CliOutcome:
    """`lt2dsl ARGV FILE` with FILE holding `data`; stdout is discarded."""
    from lt2dsl.cli import main

    with tempfile.TemporaryDirectory(dir=workdir) as d:
        path = os.path.join(d, "case.lt2")
        with open(path, "wb") as f:
            f.write(data)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                status = main([*argv[:1], path, *argv[1:]])
        except BaseException as e:  # what escaped is the finding, whatever it is
            return CliOutcome(None, err.getvalue(), f"{type(e).__name__}: {e}")
    return CliOutcome(status, err.getvalue())


def run_model(text: str, seed: int = 0) -> RunOutcome:
    """Forward + backward + decode of `text` (already accepted by `check`), fp32 reference."""
    import torch

    from lt2dsl.lowering import compile_model

    torch.manual_seed(seed)
    try:
        model = compile_model(text, backend="reference", dtype=torch.float32)
        ids = _tokens(model, seed)
        out = model(ids)
        out.float().square().mean().backward()
        finite = bool(torch.isfinite(out).all())
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        grads_finite = all(bool(torch.isfinite(g).all()) for g in grads)
        err = decode_error(model, ids)
        if err <= DECODE_RTOL:
            return RunOutcome(finite, grads_finite, err)
        return RunOutcome(finite, grads_finite, err, "", *in_float64(model, ids))
    except Exception as e:
        return RunOutcome(False, False, math.inf, f"{type(e).__name__}: {e}")


def in_float64(model, ids) -> tuple[float, float]:
    """(fp32 forward against the float64 forward, float64 decode against it) of one model."""
    import copy

    import torch

    exact = copy.deepcopy(model).double()
    with torch.no_grad():
        model.eval()
        exact.eval()
        truth = exact(ids)
        scale = max(truth.abs().max().item(), 1e-30)
        forward = (model(ids).double() - truth).abs().max().item() / scale
    return forward, decode_error(exact, ids)


def _tokens(model, seed: int):
    import torch

    T = min(SEQ, model.max_len or SEQ)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab, (BATCH, T), generator=g)


def decode_error(model, ids) -> float:
    """max |prefill + decode steps − forward| / max |forward|, in eval mode."""
    import torch

    model.eval()
    with torch.no_grad():
        whole = model(ids)
        cache = model.new_cache(ids.shape[0])
        k = min(PREFILL, ids.shape[1])
        pieces = [model(ids[:, :k], cache)]
        pieces += [model(ids[:, t : t + 1], cache) for t in range(k, ids.shape[1])]
        got = torch.cat(pieces, dim=1)
    scale = whole.abs().max().item()
    return (got - whole).abs().max().item() / max(scale, 1e-30)
