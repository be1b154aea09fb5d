"""CPU backends: lowbit's C kernels (``../csrc``) and the torch int8 operators they are compared with."""
