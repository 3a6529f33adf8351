"""The program as data: primitive ops read through views (`graph`), the high-level ops written once
in those primitives (`hl_ops`: matmul, softmax, layer norm, attention), and the numpy reference
interpreter (`interpret`) that every later stage is checked against."""
