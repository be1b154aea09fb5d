import json

import pytest

from lowbit.quantize import PRESETS, Scheme, SchemeError, get_scheme
from lowbit.quantize.overrides import apply_overrides
from lowbit.formats.scheme import ActArgs, GPTQArgs, KVArgs, OutlierArgs, WeightArgs


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_round_trip_through_json(name):
    s = get_scheme(name)
    again = Scheme.from_dict(json.loads(json.dumps(s.to_dict())))
    assert again == s and again.name == name


def test_atom_recipe_contents():
    s = get_scheme("w4a4")
    assert (s.weights.bits, s.activations.bits, s.weights.group_size, s.activations.group_size) == (4, 4, 128, 128)
    assert s.outliers.count > 0 and s.outliers.precision == "int8" and s.gptq.enabled
    assert get_scheme("w4a4-kv4").kv_cache == KVArgs(bits=4, symmetric=False, hadamard=True)
    assert get_scheme("w4a4-kv4-rot") == get_scheme("w4a4-kv4").with_(name="w4a4-kv4-rot",
                                                                       rotation=get_scheme("w4a4-rot").rotation)
    assert get_scheme("w8a8").smooth.enabled and get_scheme("w4a16").activations.bits == 16
    assert get_scheme("w4a4-fp4").weights.format == "fp4"


@pytest.mark.parametrize("make", [
    lambda: WeightArgs(bits=7), lambda: WeightArgs(bits=4, group_size=-1), lambda: WeightArgs(bits=4, clip_ratio=0),
    lambda: WeightArgs(bits=3, format="fp4"), lambda: ActArgs(bits=4, format="nf4"), lambda: ActArgs(bits=4, dynamic=False),
    lambda: OutlierArgs(count=-1), lambda: OutlierArgs(precision="int4"), lambda: KVArgs(bits=5),
    lambda: GPTQArgs(damp=1.5), lambda: GPTQArgs(block_size=0),
    lambda: Scheme(gptq=GPTQArgs(enabled=True)),
    lambda: Scheme(weights=WeightArgs(bits=4), outliers=OutlierArgs(count=8), gptq=GPTQArgs(enabled=True, act_order=True)),
])
def test_invalid_schemes_raise_clear_errors(make):
    with pytest.raises(SchemeError):
        make()


def test_from_dict_rejects_unknown_fields_and_types():
    with pytest.raises(SchemeError, match="unknown field"):
        Scheme.from_dict({"weights": {"bitz": 4}})
    with pytest.raises(SchemeError, match="unknown scheme field"):
        Scheme.from_dict({"wieghts": {}})
    with pytest.raises(SchemeError):
        Scheme.from_dict([1, 2])
    with pytest.raises(SchemeError, match="unknown scheme"):
        get_scheme("w2a2")


def test_overrides():
    s = apply_overrides(get_scheme("w4a4"), ["outliers.count=64", "weights.clip_search=false"])
    assert s.outliers.count == 64 and not s.weights.clip_search
    with pytest.raises(SchemeError):
        apply_overrides(s, ["outliers=3"])
    with pytest.raises(SchemeError):
        apply_overrides(s, ["outliers.cnt=3"])
    with pytest.raises(SchemeError):
        apply_overrides(s, ["weights.bits=7"])
