"""Whatever `check` accepts compiles and runs: generated programs over every kind and option.

A fixed-seed generator (`lt2dsl.fuzz.programs`) writes well-formed programs from the registry's
option schemas, mostly in range, sometimes not. Each goes through `lt2dsl compile --emit fx`
in-process: exit 0 (accepted and lowered) or 1 (a diagnostic), never an internal error. A
sample of the accepted ones runs on the reference backend in fp32: forward and backward finite,
a prefill followed by single-token decode steps equal to the forward within 1e-4 relative.
`python -m lt2dsl.fuzz` runs the same at the sizes of docs/reliability.md.
"""

import dataclasses
import random
import re

import pytest

from lt2dsl.fuzz import programs
from lt2dsl.fuzz.pool import HANG, run_jobs
from lt2dsl.fuzz.runner import DECODE_RTOL, run_cli, run_model
from lt2dsl.ir.registry import REGISTRY

N = 240
RUN_EVERY = 4  # every 4th accepted program runs (about 20)


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> list[tuple[str, int, str]]:
    work = str(tmp_path_factory.mktemp("programs"))
    rnd = random.Random(20260102)
    out = []
    for _ in range(N):
        text = programs.generate(rnd)
        o = run_cli(["compile", "--emit", "fx"], text.encode(), work)
        assert not o.escaped, (text, o.escaped)
        out.append((text, o.status, o.stderr))
    return out


def accepted(generated) -> list[str]:
    return [text for text, status, _ in generated if status == 0]


def test_accepted_programs_lower_and_rejected_ones_have_diagnostics(generated):
    for text, status, err in generated:
        assert status in (0, 1) and "E9999" not in err and "Traceback" not in err, (text, err)
        assert (status == 1) == bool(re.search(r"^error\[E\d{4}\]: ", err, re.M)), (text, err)


def test_the_generator_covers_every_kind_and_option(generated):
    texts = "\n".join(text for text, _, _ in generated)
    ok = "\n".join(accepted(generated))
    assert len(accepted(generated)) > N // 4, "too few programs were accepted to test anything"
    for kind, spec in REGISTRY.items():
        assert re.search(rf"\b({'|'.join([kind, *spec.aliases])})\b", ok), f"no accepted `{kind}`"
        for o in spec.options:
            assert f"{o.name}=" in texts, f"option `{o.name}` of `{kind}` never generated"
    for construct in ("loop T=", "repeat ", "par(", " * ", "let ", "exit=gate", "inject=", "final_norm="):
        assert construct in ok, construct


def test_accepted_programs_run_finite_and_decode_as_they_run(generated):
    for text in accepted(generated)[::RUN_EVERY]:
        o = run_model(text)
        assert not o.error, (text, o.error)
        assert o.finite and o.grads_finite, text
        assert o.decodes_as_it_runs, (text, o)


def test_an_ill_conditioned_model_passes_only_with_an_exact_float64_decode():
    """A one-tap tmm at position 0 scales its input; with a sandwich norm after it and a final
    norm before it, the branch can cancel the residual: fp32 resolves the output to ~1e-3."""
    text = "dim = 64\nvocab = 64\nmax_len = 64\nloop T=2, final_norm=true, norm=sandwich < tmm >"
    o = run_model(text, seed=3)
    assert o.decode_error > DECODE_RTOL and o.forward_error > 10 * DECODE_RTOL
    assert o.decode_error_fp64 < 1e-10 and o.ill_conditioned and o.ok
    broken = dataclasses.replace(o, decode_error_fp64=1e-6)  # as a cache bug would show
    assert not broken.ill_conditioned and not broken.ok


@pytest.mark.slow  # a worker process starts (torch imports): ~5 s
def test_the_hang_guard_kills_a_job_past_its_timeout():
    slow = "dim = 64\nloop T=64 < gdn; full; mamba2 >\n"
    results = dict(run_jobs([("cli", (["check"], b"dim = 64\ngdn\n")), ("run", slow)], timeout=2.0))
    assert results[0].status == 0 and results[1] == HANG
