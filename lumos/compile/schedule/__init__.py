"""From a rewritten graph to kernels and buffers: transposed layouts for row-wise reads (`layout`),
linear layers over one input merged into one matmul (`horizontal`, C), which nodes are stored and
the kernels that compute them (`kernels`), kernels with several outputs (`siblings`: row statistics,
C; `products`: matrix products of one value, CUDA), and the arena the buffers share by liveness
(`buffers`)."""
