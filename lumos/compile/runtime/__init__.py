"""Building and running what was printed: the content-addressed cache of built libraries and PTX
(`kernel_cache`, gcc for C), NVRTC for CUDA (`nvrtc`), and one native call per program
(`native`: ctypes over the C library; `cuda`: pycuda or cuda.bindings over the PTX)."""
