"""Building lowbit's C sources: the compiler call and ISA flag sets, the per-user build cache,
and what the running CPU supports. Used by the kernels and the all-reduce codecs alike."""
