"""Reliability tools: generated programs, character mutants and the runner that checks them.

`programs.generate(rnd)` writes a random well-formed `.lt2` program over every layer kind and
option of the registry; `mutants.mutate(text, rnd)` damages a text at the character level;
`runner` checks, lowers and runs them and counts what failed. `python -m lt2dsl.fuzz` runs the
sizes of docs/reliability.md; the test suite runs a few hundred with fixed seeds.
"""
