"""The estimate path is fast and torch-free."""

import subprocess
import sys
import time

from lt2dsl.cost.estimate import EstimateOptions, estimate
from lt2dsl.ir import nodes as n
from tests.cost.helpers import call, model


def test_200_blocks_estimate_in_well_under_a_second():
    kinds = ["gdn", "dsa", "full", "swa", "mamba2", "kda", "gla", "nsa"]
    body = [call(kinds[i % len(kinds)]) for i in range(200)]
    t0 = time.perf_counter()
    m = model([n.Loop(T=4, body=tuple(body))], dim=2048)
    estimate(m, EstimateOptions(seq=32768))
    assert time.perf_counter() - t0 < 0.5


def test_estimate_never_imports_torch():
    code = (
        "import sys\n"
        "from lt2dsl.cost.estimate import estimate\n"
        "from tests.cost.helpers import call, model\n"
        "estimate(model([call('gdn'), call('dsa')], dim=256))\n"
        "bad = [m for m in ('torch', 'triton') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
