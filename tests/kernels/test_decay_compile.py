"""The decay family's and Toeplitz mixer's kernels compiled for sm_90 at their own candidate configs,
checked for the pipelining race (`ttgir_checks.pipeline_hazards`), without a GPU.

Their launch arguments come from running the ops under the CPU interpreter at real head dims
(`bench/ttgir_hazard_scan.py capture`, in a subprocess: the interpreter must be off here to
compile). Runs only with LT2_AOT_CHECK=1, like the other compile tests:

    LT2_AOT_CHECK=1 TRITON_DEFAULT_FP_FUSION=1 python -m pytest -q tests/kernels/test_decay_compile.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    os.environ.get("LT2_AOT_CHECK") != "1", reason="offline sm_90 compile check: set LT2_AOT_CHECK=1"
)

ROOT = Path(__file__).parents[2]
# every decay-family and Toeplitz kernel a forward and backward launches must have compiled
EXPECTED = {
    "simple_gla": {"fwd_o_kernel", "bwd_dv_kernel", "bwd_dqkg_kernel"},
    "gla": {
        "fwd_o_kernel",
        "intra_A_kernel",
        "bwd_dA_kernel",
        "bwd_dv_kernel",
        "bwd_dqk_intra_kernel",
        "bwd_dqkg_kernel",
    },
    "mlstm": {
        "fwd_stab_kernel",
        "fwd_state_kernel",
        "fwd_o_kernel",
        "bwd_weights_kernel",
        "bwd_prep_kernel",
        "bwd_dh_kernel",
        "bwd_dv_kernel",
        "bwd_dqk_kernel",
        "route_kernel",
    },
    "common": {"chunk_fwd_h_kernel", "chunk_bwd_dh_kernel"},
    "toeplitz": {
        "mix_kernel",
        "dw_kernel",
        "spectra_kernel",
        "samples_kernel",
        "mix_tiles_kernel",
        "window_dft_kernel",
        "tiles_kernel",
        "corr_kernel",
    },
}


def test_candidate_configs_have_no_pipelining_race(tmp_path):
    launches = tmp_path / "launches.json"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "bench/ttgir_hazard_scan.py", "capture", str(launches)]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]

    sys.path.insert(0, str(ROOT))
    from bench.ttgir_hazard_scan import scan

    hazards, compiled, failed = scan(str(launches), candidates=True)
    assert not hazards, hazards
    not_built = {f.split(" ")[0] for f in failed}
    names = {(r["module"].split(".")[-2], r["name"]) for r in json.loads(launches.read_text())}
    for pkg, kernels in EXPECTED.items():
        for k in kernels:
            assert (pkg, k) in names, f"{pkg}.{k} was not launched"
            assert k not in not_built, f"{pkg}.{k} did not compile for sm_90"
    assert compiled > 0
