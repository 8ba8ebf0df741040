"""tests/test_arch70_gpu.py's checks as one script that reports each step as it finishes (for a device run with a
hard time limit, where a cut pytest prints nothing): random checkpoints, the engine under CATENGINE_ARCH=70 and on
the GPU's own row (two subprocesses at once), greedy tokens compared, teacher-forced top-1 vs float32
transformers. Same models, prompts and bars as the test (it imports them).

    python3 bench/arch70_engine_check.py OUT_DIR
"""
import json
import random
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests import test_arch70_gpu as t  # noqa: E402

T0 = time.time()


def log(out: Path, msg: str) -> None:
    line = f"[{time.time() - T0:6.1f} s] {msg}"
    print(line, flush=True)
    with open(out / "arch70_log.txt", "a") as f:
        f.write(line + "\n")


def main(out: Path) -> None:
    from catengine.tools.bench import Sizes
    from catengine.tools.bench_common import random_prompts
    from catengine.tools.correctness import _hf_class, compare_logits, correctness_specs
    from catengine.tools.random_checkpoint import write_random_checkpoint
    out.mkdir(parents=True, exist_ok=True)
    work = Path("/tmp/arch70_check")
    work.mkdir(exist_ok=True)
    for kind, spec in correctness_specs(Sizes(), quick=False).items():
        spec = dict(spec, vocab_size=t.VOCAB)
        write_random_checkpoint(work / f"{kind}-awq", spec, quant="awq", group_size=128, device="cuda", progress=False)
        write_random_checkpoint(work / f"{kind}-fp16", spec, quant=None, device="cuda", progress=False)
    log(out, "checkpoints written")
    reports, errors = {}, {}

    def run(arch):
        try:
            reports[arch or "default"] = t._run_path(work, arch)
            log(out, f"path {arch or 'default'} done")
        except BaseException as e:   # noqa: BLE001 - reported, not raised, so the other path still reports
            errors[arch or "default"] = str(e)[-3000:]
            log(out, f"path {arch or 'default'} FAILED: {str(e)[-3000:]}")

    threads = [threading.Thread(target=run, args=(a,)) for a in ("70", None)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        return
    for kind in t.KINDS:
        got, want = reports["70"]["tokens"][kind], reports["default"]["tokens"][kind]
        log(out, f"{kind} greedy: {sum(g == w for g, w in zip(got, want))} of {len(got)} prompts equal; "
                 f"70 {got} default {want}")
    ids = random_prompts(random.Random(2), 1, t.FORCED_TOKENS, t.VOCAB)[0]
    for kind in t.KINDS:
        hf = _hf_class(kind == "moe").from_pretrained(work / f"{kind}-fp16", dtype=torch.float32).to("cuda").eval()
        with torch.no_grad():
            ref = hf(torch.tensor([ids], device="cuda")).logits[0].float().cpu()
        del hf
        got = compare_logits(ref, torch.load(work / f"logits-{kind}-70.pt"))
        default = compare_logits(ref, torch.load(work / f"logits-{kind}-default.pt"))
        log(out, f"{kind} teacher-forced vs float32 transformers: CATENGINE_ARCH=70 {json.dumps(got)}; "
                 f"default {json.dumps(default)}; bar top1 >= {t.TARGET_TOP1}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
