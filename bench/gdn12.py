"""The 12-layer GDN model of issues 33 and 35 (fla's `GatedDeltaNetForCausalLM` shape at dim 1024),
as `.lt2` text: the GPU smoke run trains and generates it at full size, the decode comparison
times it against the peers."""

GDN12 = """model gdn12 {
  dim = 1024
  vocab = 32000
  tie_embeddings = true
  mlp = swiglu(hidden=2816)
  gdn(heads=8, head_dim=128, expand_v=2) * 12
}
"""
