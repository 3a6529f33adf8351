"""The measured search: a hill-climb over each kernel's schedule candidates and the e-graph's fusion
choices, timed on this machine and checked against the interpreter (`climb`), ranked first by a
model of bytes and flops (`cost_model`), with what it found kept on disk (`cache`)."""
