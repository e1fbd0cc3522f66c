"""Run under torchrun by `test_distributed.py`: train each config given, write rank 0's results.

python -m torch.distributed.run --standalone --nproc-per-node 2 dist_worker.py OUT.json A.json B.json ...
"""

import json
import sys
from pathlib import Path

import torch

from lt2dsl.train import run
from lt2dsl.train.config import validate

torch.set_num_threads(1)


def main(out: str, configs: list[str]) -> None:
    torch.distributed.init_process_group("gloo")
    results = {}
    for path in configs:
        raw = json.loads(Path(path).read_text())
        resume = raw.pop("resume", False)
        r = run(validate(raw), resume=resume)
        results[path] = {"losses": r.losses, "evals": r.evals}
    if torch.distributed.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
