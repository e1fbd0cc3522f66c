"""`passes/overrides.py`: the one owner of `--set` values and of `loop.T`."""

import pytest

from lt2dsl import frontend
from lt2dsl.frontend import load
from lt2dsl.grammar.parse import parse
from lt2dsl.ir import nodes as n
from lt2dsl.passes.overrides import applicable, apply_overrides, as_node, override_model, set_loop_T
from lt2dsl.passes.resolve import resolve

TEXT = "dim = 64\nlet two = loop T=2 < gdn >\nloop T=3 < swa; repeat 2 < loop T=4 < full > > >\ntwo\n"


def loop_Ts(node) -> list[int]:
    match node:
        case n.Program() | n.Model():
            return [t for item in node.body for t in loop_Ts(item)]
        case n.Loop() | n.LoopBlock():
            return [node.T] + [t for item in node.body for t in loop_Ts(item)]
        case n.Repeat():
            return [t for item in node.body for t in loop_Ts(item)]
        case n.Times():
            return loop_Ts(node.item)
    return []


def test_loop_T_sets_every_loop_of_the_program_and_of_the_model():
    program, _ = parse(TEXT)
    applied = apply_overrides(program, {"loop.T": n.Int(value=5)})
    assert loop_Ts(applied) == [5, 5] and loop_Ts(applied.lets[0].item) == [5]
    model = resolve(program)
    assert loop_Ts(model) == [3, 4, 4, 2]
    assert loop_Ts(override_model(model, {"loop_T": 6})) == [6, 6, 6, 6]
    assert set_loop_T(n.Call(name="gdn"), 7) == n.Call(name="gdn")


def test_settings_replace_or_add_and_bad_loop_T_is_left_for_validation():
    program, _ = parse(TEXT)
    applied = apply_overrides(program, {"dim": n.Int(value=128), "vocab": n.Int(value=99)})
    assert {s.name: s.value.value for s in applied.settings} == {"dim": 128, "vocab": 99}
    assert applicable({"loop.T": n.Int(value=0), "dim": n.Int(value=8)}) == {"dim": n.Int(value=8)}
    assert applicable({"loop_T": n.Float(value=1.5)}) == {}


def test_a_resolved_model_takes_only_a_positive_loop_T():
    model = resolve(parse(TEXT)[0])
    with pytest.raises(ValueError, match="only the loop_T override"):
        override_model(model, {"dim": 128})
    with pytest.raises(ValueError, match="positive integer"):
        override_model(model, {"loop_T": 0})
    assert override_model(model, {}) is model


def test_python_values_become_nodes():
    assert as_node(True) == n.Bool(value=True) and as_node(3) == n.Int(value=3)
    assert as_node("32k") == "32k" and as_node("32k", parse=True).value == 32768
    with pytest.raises(ValueError, match="numbers, booleans or strings"):
        as_node([1])


def test_load_applies_the_overrides_once(monkeypatch):
    calls = []

    def counted(prog, overrides):
        calls.append(dict(overrides))
        return apply_overrides(prog, overrides)

    monkeypatch.setattr(frontend, "apply_overrides", counted)
    loaded = load(TEXT, {"loop.T": "8", "dim": "128"})
    assert loaded.ok and loop_Ts(loaded.model) == [8, 8, 8, 8] and loaded.model.config.dim == 128
    assert len(calls) == 1
