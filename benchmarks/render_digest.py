"""Every C and CUDA rendering of both benchmark models, hashed: the check that a change to the
kernel IR or the printers changed no generated text.

For the quickstart and SASRec-size models (benchmarks/compile.py), after the C pipeline's graph
passes (e-graph, horizontal, layout, schedule, siblings): every kernel under every schedule candidate the
`schedule` rules reach (register blocks included), the fused-attention kernels (keys staged and not)
likewise, and the whole library under the renderer's default; and the CUDA program. Prints one
digest per model and target and writes every rendering's hash to --out (JSON), so two runs can be
compared kernel by kernel:

    python benchmarks/render_digest.py --out /tmp/before.json   # on the old code
    python benchmarks/render_digest.py --out /tmp/after.json --compare /tmp/before.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from compile import QUICKSTART_FEATURES, SASREC_CONFIG, SASREC_FEATURES  # noqa: E402

from lumos.compile.egraph.attention import find_attention, fuse_attention  # noqa: E402
from lumos.compile.egraph.schedule import schedule_candidates  # noqa: E402
from lumos.compile.frontend.lumos_model import lower_model  # noqa: E402
from lumos.compile.program import Compilation, Options, run_passes  # noqa: E402
from lumos.compile.render.c import canonical_kernel_source, render_library  # noqa: E402
from lumos.compile.runtime.kernel_cache import KernelCache  # noqa: E402
from lumos.compile.target import CPU, CUDA  # noqa: E402
from lumos.core.config import load_config  # noqa: E402
from lumos.quickstart import RECIPES  # noqa: E402
from lumos.train.config import TrainConfig  # noqa: E402
from lumos.train.model import LumosModel  # noqa: E402

BATCH = 8


def _models() -> dict[str, LumosModel]:
    torch.manual_seed(0)
    quickstart = load_config(TrainConfig, RECIPES / "train.toml").model
    return {"quickstart": LumosModel(quickstart, QUICKSTART_FEATURES).eval(),
            "sasrec": LumosModel(SASREC_CONFIG, SASREC_FEATURES).eval()}


CHECKOUT = str(Path(__file__).resolve().parent.parent)


def _digest(text: str) -> str:
    # Kernel comments name the model's source lines by path: the same code in another checkout
    # prints the same kernels.
    return hashlib.sha256(text.replace(CHECKOUT, "<checkout>").encode()).hexdigest()[:16]


def c_renderings(model: LumosModel, cache: KernelCache, options: Options) -> dict[str, str]:
    graph_passes = [step for step in CPU.passes if step[0] in ("egraph", "horizontal", "layout", "schedule", "siblings")]
    compilation = run_passes(graph_passes, Compilation(lower_model(model, BATCH, model.max_len, symbolic_batch=True), options), cache)
    graph = compilation.graph
    programs = {"plain": (compilation.kernels, compilation.materialized)}
    matches, _ = find_attention(graph)
    if matches:
        kernels, materialized, _ = fuse_attention(graph, compilation.materialized, matches)
        programs["fused"] = (kernels, materialized)
        kernels, materialized, _ = fuse_attention(graph, compilation.materialized, matches, stage_keys=True)
        programs["staged"] = (kernels, materialized)
    hashes = {}
    for program, (kernels, materialized) in programs.items():
        for kernel in kernels:
            candidates, _ = schedule_candidates(kernel)
            for index, schedule in enumerate([None, *candidates]):
                hashes[f"{program}/{kernel.name}/{index}"] = _digest(canonical_kernel_source(kernel, materialized, schedule))
    planned = run_passes([step for step in CPU.passes if step[0] == "plan_buffers"], compilation, cache)
    hashes["library"] = _digest(render_library(graph, planned.kernels, planned.materialized, planned.buffers))
    return hashes


def cuda_renderings(model: LumosModel, cache: KernelCache, options: Options) -> dict[str, str]:
    passes = [step for step in CUDA.passes if step[0] != "build"]
    compilation = run_passes(passes, Compilation(lower_model(model, BATCH, model.max_len), options, CUDA.name), cache)
    program = compilation.cuda
    hashes = {f"kernel/{name}": _digest(source) for name, source in program.kernels.items()}
    return {**hashes, "source": _digest(program.source), "launches": _digest(repr(program.launches))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON file for every rendering's hash")
    parser.add_argument("--compare", type=Path, help="an earlier --out: print what differs, exit 1 if anything does")
    parser.add_argument("--multi-output", action="store_true",
                        help="Options.multi_output on: sibling row statistics joined into one kernel each")
    args = parser.parse_args()
    options = Options(multi_output=args.multi_output)
    result = {}
    with tempfile.TemporaryDirectory(prefix="lumos-digest-") as folder:
        cache = KernelCache(folder, "cpu")
        for name, model in _models().items():
            for target, render in (("c", c_renderings), ("cuda", cuda_renderings)):
                hashes = render(model, cache, options)
                result[f"{name}/{target}"] = hashes
                total = _digest("\n".join(f"{key} {value}" for key, value in sorted(hashes.items())))
                print(f"{name:10s} {target:4s} {len(hashes):5d} renderings  digest {total}", flush=True)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True))
    if args.compare:
        before = json.loads(args.compare.read_text())
        differ = [f"{group}/{key}" for group in sorted(set(before) | set(result))
                  for key in sorted(set(before.get(group, {})) | set(result.get(group, {})))
                  if before.get(group, {}).get(key) != result.get(group, {}).get(key)]
        print(f"{len(differ)} renderings differ" + "".join(f"\n  {key}" for key in differ[:40]))
        sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
