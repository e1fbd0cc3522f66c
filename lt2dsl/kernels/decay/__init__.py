"""The decay family's shared room: what `gla`, `simple_gla` and `mlstm` (mixers.md §1–3, §7, §8)
have in common — argument checks and varlen helpers (`utils.py`), chunk bookkeeping and the gates'
chunk-local cumsum (`chunks.py`), the chunk-boundary state scans (`chunk_h.py`), the token-recurrent
decode kernel (`recurrent.py`), the Triton entries' dispatch (`ops.py`) and their compile jobs.
"""
