"""``lowbit eval ppl --tp W``: an impossible split fails before any rank starts."""

import pytest

from lowbit.cli import main


@pytest.mark.model
def test_eval_ppl_rejects_more_ranks_than_heads(capsys):
    assert main(["eval", "ppl", "--tp", "64", "--allreduce", "int4", "--max-windows", "1", "--seqlen", "64"]) == 2
    assert "error" in capsys.readouterr().err.lower()
