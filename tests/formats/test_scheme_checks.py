"""The checks weights and activations share are written once and keep each field's own name in
the message; a bad scheme is a LowbitError (one line on the command line)."""

import pytest

from lowbit.errors import LowbitError
from lowbit.formats.scheme import ActArgs, KVArgs, SchemeError, WeightArgs


@pytest.mark.parametrize("cls,where", [(WeightArgs, "weights"), (ActArgs, "activations")])
def test_shared_checks_name_their_field(cls, where):
    with pytest.raises(SchemeError, match=rf"^{where}\.format must be one of \('int', 'fp4'\), got 'fp8'$"):
        cls(bits=4, format="fp8")
    with pytest.raises(SchemeError, match=rf"^{where}\.format 'fp4' needs bits=4$"):
        cls(bits=8, format="fp4")
    with pytest.raises(SchemeError, match=rf"^{where}\.bits must be one of"):
        cls(bits=7)
    with pytest.raises(SchemeError, match=rf"^{where}\.group_size must be an integer >= 0"):
        cls(bits=4, group_size=-1)
    with pytest.raises(SchemeError, match=rf"^{where}\.clip_ratio must be in \(0, 1\]"):
        cls(bits=4, clip_ratio=1.5)


def test_enabled_and_error_type():
    assert WeightArgs(bits=4).enabled and not WeightArgs().enabled
    assert ActArgs(bits=8).enabled and not ActArgs().enabled
    assert KVArgs(bits=4).enabled and not KVArgs().enabled
    assert issubclass(SchemeError, LowbitError) and issubclass(SchemeError, ValueError)
