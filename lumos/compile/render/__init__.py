"""Printers from the kernel IR to source text: the C-style printing both targets share
(`cstyle`), the CPU library in C with OpenMP (`c`) and the CUDA kernels with their launches
(`cuda`). Only this folder builds C or CUDA text."""
