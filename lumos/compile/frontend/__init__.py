"""From PyTorch to the IR: the Lumos model's forward traced with `torch.export` (`lumos_model`),
any `nn.Module` (`export`: `compile_module`), and `torch.compile(backend="lumos")`
(`torch_backend`, found through the `torch_dynamo_backends` entry point)."""
