"""Communication: all-reduce codecs, the two-shot quantized all-reduce, size policy, tensor parallelism."""
