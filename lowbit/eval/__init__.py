"""Evaluation: perplexity, zero-shot accuracy, KL divergence.

* :func:`lowbit.eval.perplexity.perplexity` - WikiText-2 / PTB perplexity, the standard protocol.
* :func:`lowbit.eval.kl.kl_divergence` - KL from a reference model (or a saved top-k reference).
* :func:`lowbit.eval.zeroshot.evaluate_task` - PIQA, ARC, BoolQ, WinoGrande, LAMBADA accuracy.
* :func:`lowbit.eval.windows.eval_windows` - the evaluation windows, computed once.
* :mod:`lowbit.eval.harness` - an lm-evaluation-harness ``LM`` (needs lm-eval installed).

Submodules are imported on use, so ``import lowbit.eval`` stays cheap.
"""
