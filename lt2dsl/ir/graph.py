"""The resolved model as a graph: a derived view for `lt2dsl graph`, never a second source of truth.

`to_graph(model)` builds a `networkx.DiGraph` keyed by stable ids: `embed`, every block id
(`loop0/1:gdn`), every loop id (`loop0`), `norm` (the final norm) and `head`. Data flows along
the edges. A loop is a header node: an edge enters its first block, its last block has a back
edge to the header (attribute `back=True`, label `×T`), and the header's out edge leaves the
loop. A `par` block is a sum node (the block id) fed by one branch node per mixer
(`3:gdn+swa/0:gdn`). Every node has `kind`, `label`, `depth` (loop nesting), `parent` (the
enclosing loop id or None) and `order` (reading order, for the text view).
"""

from __future__ import annotations

import networkx as nx

from lt2dsl.ir import nodes as n
from lt2dsl.ir.printer import floating
from lt2dsl.ir.registry import REGISTRY


def to_graph(model: n.Model) -> nx.DiGraph:
    g = nx.DiGraph(name=model.config.name)
    cfg = model.config
    _add(g, "embed", "embedding", f"embedding {cfg.vocab} × {cfg.dim}", 0, None)
    exits = _stages(g, model.body, ["embed"], 0, None, cfg)
    _add(g, "norm", "norm", f"final norm {_norm(cfg.norm)}", 0, None)
    _connect(g, exits, "norm")
    if cfg.head:
        tied = " (tied to the embedding)" if cfg.tie_embeddings else ""
        _add(g, "head", "head", f"LM head {cfg.dim} × {cfg.vocab}{tied}", 0, None, tied=cfg.tie_embeddings)
        g.add_edge("norm", "head")
    return g


def _add(g: nx.DiGraph, node: str, kind: str, label: str, depth: int, parent: str | None, **attrs) -> None:
    g.add_node(node, kind=kind, label=label, depth=depth, parent=parent, order=g.number_of_nodes(), **attrs)


def _connect(g: nx.DiGraph, sources: list[str], target: str) -> None:
    for s in sources:
        g.add_edge(s, target)


def _stages(g, stages, prev: list[str], depth: int, parent: str | None, cfg: n.ModelConfig) -> list[str]:
    for stage in stages:
        if isinstance(stage, n.LoopBlock):
            prev = _loop(g, stage, prev, depth, parent, cfg)
        else:
            prev = _block(g, stage, prev, depth, parent, cfg)
    return prev


def _loop(g, loop: n.LoopBlock, prev, depth, parent, cfg) -> list[str]:
    extras = [
        x
        for x in (
            "final_norm" if loop.final_norm else "",
            "" if loop.inject == "none" else f"inject={loop.inject}",
            f"exit gate {loop.exit.threshold}" if loop.exit else "",
        )
        if x
    ]
    label = f"loop ×{loop.T} (shared weights)" + (f" [{', '.join(extras)}]" if extras else "")
    _add(g, loop.id, "loop", label, depth, parent, T=loop.T)
    _connect(g, prev, loop.id)
    exits = _stages(g, loop.body, [loop.id], depth + 1, loop.id, cfg)
    for e in exits:
        g.add_edge(e, loop.id, back=True, label=f"×{loop.T}")
    return [loop.id]


def _block(g, b: n.Block, prev, depth, parent, cfg) -> list[str]:
    tail = f" · {_mlp(b.mlp)} · {_norm(b.norm)}"
    if len(b.mixers) == 1:
        _add(g, b.id, "block", mixer_label(b.mixers[0], cfg) + tail, depth, parent)
        _connect(g, prev, b.id)
        return [b.id]
    _add(g, b.id, "par", f"par: sum of {len(b.mixers)} mixers" + tail, depth, parent)
    for i, m in enumerate(b.mixers):
        branch = f"{b.id}/{i}:{m.type}"
        _add(g, branch, "branch", mixer_label(m, cfg), depth + 1, parent, block=b.id)
        _connect(g, prev, branch)
        g.add_edge(branch, b.id)
    return [b.id]


def mixer_label(m: n.Mixer, cfg: n.ModelConfig) -> str:
    """`gdn heads=16 head_dim=128 expand_v=1`: heads, head dim, and options off their defaults."""
    spec = REGISTRY[m.type]
    shown = {k: m.opts[k] for k in ("heads", "head_dim") if k in m.opts}
    for o in spec.options:
        if o.name in m.opts and o.name not in shown and m.opts[o.name] != o.default_for(cfg, m.opts):
            shown[o.name] = m.opts[o.name]
    name = f"{m.type} {m.label!r}" if m.label else m.type
    return " ".join([name, *(f"{k}={_fmt(v)}" for k, v in shown.items())])


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _mlp(m: n.MlpSpec) -> str:
    return "no mlp" if m.type == "none" else f"{m.type}({m.hidden})"


def _norm(nm: n.NormSpec) -> str:
    return f"{'sandwich ' if nm.sandwich else ''}{nm.type}(eps={floating(nm.eps)})"


# ---- views ------------------------------------------------------------------------------------


def to_text(g: nx.DiGraph) -> str:
    """One node per line in reading order, indented by loop nesting; loops end with their back edge."""
    lines = []
    nodes = sorted(g.nodes(data=True), key=lambda x: x[1]["order"])
    width = max(len(v) + 2 * d["depth"] for v, d in nodes)
    open_loops: list[str] = []
    for node, d in nodes:
        while open_loops and d["parent"] != open_loops[-1] and not _inside(g, d, open_loops[-1]):
            lines.append(_back_line(g, open_loops.pop()))
        pad = "  " * d["depth"]
        lines.append(f"{pad}{node}".ljust(width + 2) + d["label"])
        if d["kind"] == "loop":
            open_loops.append(node)
    lines += [_back_line(g, loop) for loop in reversed(open_loops)]
    return "\n".join(lines)


def _inside(g: nx.DiGraph, d: dict, loop: str) -> bool:
    parent = d["parent"]
    while parent is not None:
        if parent == loop:
            return True
        parent = g.nodes[parent]["parent"]
    return False


def _back_line(g: nx.DiGraph, loop: str) -> str:
    d = g.nodes[loop]
    src = next(u for u, _, e in g.in_edges(loop, data=True) if e.get("back"))
    return "  " * (d["depth"] + 1) + f"↺ {src} → {loop} ×{d['T']}"


SHAPES = {
    "embedding": "ellipse",
    "head": "ellipse",
    "norm": "box",
    "block": "box",
    "par": "circle",
    "branch": "box",
    "loop": "diamond",
}


def to_dot(g: nx.DiGraph) -> str:
    """Graphviz DOT: loops as clusters around their blocks, back edges dashed and labelled ×T."""
    name = _q(g.graph.get("name", "model"))
    lines = [f"digraph {name} {{", "  rankdir=TB;", "  node [fontname=monospace];"]
    lines += _cluster(g, None, "  ")
    for u, v, e in g.edges(data=True):
        attrs = " [style=dashed, constraint=false, label=" + _q(e["label"]) + "]" if e.get("back") else ""
        lines.append(f"  {_q(u)} -> {_q(v)}{attrs};")
    lines.append("}")
    return "\n".join(lines)


def _cluster(g: nx.DiGraph, parent: str | None, indent: str) -> list[str]:
    out = []
    for node, d in sorted(g.nodes(data=True), key=lambda x: x[1]["order"]):
        if d["parent"] != parent or (d["kind"] == "loop" and parent is not None and node == parent):
            continue
        shape = SHAPES.get(d["kind"], "box")
        out.append(f"{indent}{_q(node)} [shape={shape}, label={_q(node + chr(10) + d['label'])}];")
        if d["kind"] == "loop":
            out.append(f"{indent}subgraph {_q('cluster_' + node)} {{")
            out.append(f"{indent}  label={_q(d['label'])}; style=rounded;")
            out += _cluster(g, node, indent + "  ")
            out.append(f"{indent}}}")
    return out


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
