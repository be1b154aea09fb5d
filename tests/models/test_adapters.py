import pytest
from torch import nn

from lowbit.models.adapters import UnsupportedArchitectureError, get_adapter
from lowbit.models.module_paths import get_path
from tests.tiny_models import TINY_ARCHS, tiny_model


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_groups_name_real_linears_and_norms(arch):
    model = tiny_model(arch)
    ad = get_adapter(model)
    ad.prepare(model)
    layer = ad.layers(model)[0]
    groups = ad.groups(layer)
    names = [n for g in groups for n in g.linears]
    assert all(isinstance(get_path(layer, n), nn.Linear) for n in names)
    assert len(set(names)) == len(names)
    shared = [g for g in groups if g.norm]
    assert len(shared) == 2 and all(get_path(layer, g.norm).weight.dim() == 1 for g in shared)
    for g in groups:  # a group's members read one input: equal input widths
        assert len({get_path(layer, n).in_features for n in g.linears}) == 1
    assert ad.norm_offset == (1.0 if arch == "gemma" else 0.0)
    if arch == "mixtral":
        assert shared[1].extra == ["mlp.gate.weight"]


def test_unsupported_model_type():
    class Fake(nn.Module):
        class config:
            model_type = "bert"

    with pytest.raises(UnsupportedArchitectureError, match="bert"):
        get_adapter(Fake())
    with pytest.raises(ValueError, match="unknown tiny"):
        tiny_model("gpt9")
