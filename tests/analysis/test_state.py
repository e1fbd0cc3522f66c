"""The state probe: application order, rank bounds, and the receptive field of a delta rule that
forgets (strong decay), that does not (no decay), and of its second loop iteration."""

from __future__ import annotations

import torch

import lt2dsl
from lt2dsl.analysis.state import applications, perturbed, state_probe

L = 32


def gdn_loop(A_log: float, T: int = 2):
    torch.manual_seed(0)
    text = f"model m {{\n  dim = 32\n  vocab = 16\n  heads = 2\n  loop T={T} < gdn(expand_v=1) >\n}}\n"
    model = lt2dsl.compile(text, backend="reference", dtype=torch.float64)
    with torch.no_grad():
        model.blocks[0].mixers[0].A_log.fill_(A_log)  # decay α = exp(−e^{A_log} · softplus(·))
    return model


def ids(n: int = L) -> torch.Tensor:
    return torch.randint(0, 16, (2, n), generator=torch.Generator().manual_seed(1))


def test_applications_follow_execution_order():
    text = "model m {\n  dim = 16\n  heads = 2\n  gdn\n  loop T=2 < gdn; par(full, deltanet) >\n  retnet\n}\n"
    model = lt2dsl.compile(text, device="meta")
    got = [(a.k, a.block, a.iteration, a.kinds) for a in applications(model)]
    assert got == [
        (0, 0, (), ("gdn",)),
        (1, 1, (0,), ("gdn",)),
        (2, 2, (0,), ("full", "deltanet")),
        (3, 1, (1,), ("gdn",)),
        (4, 2, (1,), ("full", "deltanet")),
        (5, 3, (), ("retnet",)),
    ]


def test_rank_is_bounded_by_the_tokens_written():
    # each token adds one rank-one update, so after 3 tokens S has rank <= 3
    for n, most in ((3, 3), (L, 16)):
        rows = state_probe(gdn_loop(-20.0, T=1), ids(n), probes=4)
        assert len(rows) == 2 and all(r.shape == (16, 16) for r in rows)
        assert all(r.rank <= most and r.effective_rank <= r.rank + 1e-9 for r in rows)
    assert all(r.rank > 3 for r in rows)  # 32 tokens without decay write more than 3 directions


def test_receptive_field_of_a_forgetting_state_is_short_and_grows_with_the_loop():
    forget = state_probe(gdn_loop(5.0), ids(), probes=L)
    keep = state_probe(gdn_loop(-20.0), ids(), probes=L)
    first = [r.receptive_field for r in forget if r.iteration == "0"]
    second = [r.receptive_field for r in forget if r.iteration == "1"]
    assert max(first) <= 10 and all(b >= a for a, b in zip(first, second)) and sum(second) > sum(first)
    assert all(r.receptive_field == L and r.first_influence > 1e-2 for r in keep)


def test_perturbed_rows_change_exactly_one_token():
    x = ids()
    p = perturbed(x, [0, 5], vocab=16, seed=0)
    assert p.shape == (4, L)
    diff = (p != x.repeat(2, 1)).nonzero().tolist()
    assert diff == [[0, 0], [1, 0], [2, 5], [3, 5]] and int(p.max()) < 16


def test_a_model_without_matrix_states_gives_no_rows():
    model = lt2dsl.compile(
        "model m {\n  dim = 16\n  vocab = 8\n  heads = 2\n  full\n}\n", backend="reference"
    )
    assert state_probe(model, torch.zeros(1, 4, dtype=torch.long)) == []


def test_a_par_block_probes_each_mixer():
    text = "model m {\n  dim = 16\n  vocab = 8\n  heads = 2\n  par(gdn(expand_v=1), full)\n}\n"
    model = lt2dsl.compile(text, backend="reference", dtype=torch.float64)
    rows = state_probe(model, torch.randint(0, 8, (1, 6)), probes=6)
    assert [(r.kind, r.head) for r in rows] == [("gdn", 0), ("gdn", 1)]
