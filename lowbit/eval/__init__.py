"""Evaluation: perplexity, zero-shot accuracy, KL divergence."""
