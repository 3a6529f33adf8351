"""From PyTorch to the IR: the Lumos model's forward traced with `torch.export` (`lumos_model`),
any `nn.Module` (`export`: `compile_module`), and `torch.compile(backend="lumos")`
(`torch_backend`, found through the `torch_dynamo_backends` entry point). `partition` cuts a graph
around the ops no lowering reads (they run in eager); `fast_path` keeps PyTorch's fused attention
kernels out of the graph, or rewrites them."""
