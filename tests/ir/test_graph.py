"""The block graph: ids, loop back edges, par branches, and the text and DOT views."""

from pathlib import Path

import networkx as nx

from lt2dsl.frontend import load
from lt2dsl.ir.graph import to_dot, to_graph, to_text
from lt2dsl.passes.resolve import blocks
from tests.golden import check_golden

GOLDEN = Path(__file__).with_name("graph")
SOURCE = """\
model g {
  dim = 256
  heads = 4
  gdn
  loop T=3, final_norm=true < gdn; par(gdn, swa(window=64)); loop T=2 < dsa(topk=64) > >
  repeat 2 < mamba2 >
}
"""


def graph(text: str = SOURCE) -> nx.DiGraph:
    loaded = load(text)
    assert loaded.model is not None, loaded.render()
    return to_graph(loaded.model)


def test_nodes_are_keyed_by_block_ids():
    loaded = load(SOURCE)
    g = to_graph(loaded.model)
    for b, _ in blocks(loaded.model.body):
        assert b.id in g
    assert {"embed", "norm", "head"} <= set(g)


def test_flow_from_embedding_to_head():
    g = graph()
    forward = nx.DiGraph([(u, v) for u, v, e in g.edges(data=True) if not e.get("back")])
    assert nx.is_directed_acyclic_graph(forward)
    assert nx.has_path(forward, "embed", "head")
    # every node is reached from the embedding and reaches the head (loops through their headers)
    assert nx.descendants(g, "embed") | {"embed"} == set(g)
    assert nx.ancestors(g, "head") | {"head"} == set(g)
    assert g.in_degree("embed") == 0 and g.out_degree("head") == 0


def test_loops_have_a_back_edge_labelled_with_T():
    g = graph()
    back = {(u, v): e["label"] for u, v, e in g.edges(data=True) if e.get("back")}
    loops = {v: d["T"] for v, d in g.nodes(data=True) if d["kind"] == "loop"}
    assert sorted(loops.values()) == [2, 3]
    assert sorted(back.values()) == ["×2", "×3"]
    for (u, v), label in back.items():
        assert label == f"×{loops[v]}"
        assert g.nodes[u]["parent"] == v  # the edge runs from the loop's last stage to its header


def test_nested_loop_is_inside_the_outer_one():
    g = graph()
    outer, inner = sorted((v for v, d in g.nodes(data=True) if d["kind"] == "loop"), key=len)
    assert g.nodes[inner]["parent"] == outer and g.nodes[inner]["depth"] == 1
    # the inner loop's header is the outer loop's last stage
    assert g.edges[inner, outer]["back"]


def test_par_has_one_branch_per_mixer():
    g = graph()
    (par,) = [v for v, d in g.nodes(data=True) if d["kind"] == "par"]
    branches = list(g.predecessors(par))
    assert sorted(g.nodes[b]["label"].split()[0] for b in branches) == ["gdn", "swa"]
    assert all(g.nodes[b]["kind"] == "branch" for b in branches)


def test_backbone_without_head():
    g = graph("dim = 64\nhead = none\ngdn")
    assert "head" not in g and g.out_degree("norm") == 0


def test_text_view_golden():
    check_golden(GOLDEN / "nested.txt", to_text(graph()) + "\n")


def test_dot_view():
    dot = to_dot(graph())
    assert dot.startswith('digraph "g" {') and dot.rstrip().endswith("}")
    assert dot.count("subgraph") == 2
    assert 'style=dashed, constraint=false, label="×3"' in dot
    assert '"embed" -> "0:gdn";' in dot
