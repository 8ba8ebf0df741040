"""The whole engine on the sm_70 choices (``CATENGINE_ARCH=70``) on whatever GPU runs the tests: greedy tokens equal
to the GPU's own path on random AWQ dense and MoE models, and teacher-forced top-1 agreement with float32
transformers. The switch is read once, at import, so each path runs in its own subprocess (this file, run as a
script, is that subprocess).

The models are the bench's mid-size correctness models (hidden 1024, 8 layers, the MoE 64 experts top-8) with a
512-token vocabulary. Not the tiny-* presets: random weights give nearly flat logits, and on the H200 (2026-12-02,
default path, 200 tokens) the tiny MoE agreed with float32 transformers on only 0.985 of the positions (transformers'
own fp16 0.995): near-ties, not kernel errors. The mid-size pair agreed on 0.998 (dense and MoE, 512 tokens), so
the 0.99 bar there measures the kernels."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("dense", "moe")
VOCAB = 512
# few greedy decisions: each is an argmax of fp16 logits, and a near-tie may flip between two correct kernels
PROMPTS = [[(11 * i + 5 * j) % 500 + 1 for j in range(5 + 30 * i)] for i in range(3)]   # 5, 35, 65 tokens
MAX_TOKENS = 8
# Two correct paths may still pick different greedy tokens where the top two are nearly tied. On the H200 the
# two paths' teacher-forced logprobs of the same token differed by at most 0.006 (dense AWQ) and 0.030 (MoE AWQ)
# over 512 positions (2026-12-02), so a flip needs a top-2 gap below 2 x 0.03: a divergence is accepted only
# there, between the default path's two best tokens, and in at most one prompt per model.
NEAR_TIE = 0.06
# teacher-forced: half the ids as one prefill chunk (the prefill kernels), the rest one decode step each
FORCED_TOKENS = 512
TARGET_TOP1 = 0.99   # issue 18 (the same bar as the bench's correctness report, catengine.tools.correctness)


def _worker(workdir: Path) -> None:
    """Run in a subprocess: greedy tokens of the AWQ models through the engine, and teacher-forced fp16 logits of
    the unquantized ones, written under ``workdir`` for the path this process's CATENGINE_ARCH selects."""
    from catengine import Engine, SamplingParams
    from catengine.kernels.common import arch
    from catengine.tools.bench_common import random_prompts
    from catengine.tools.correctness import catengine_logits

    dev = torch.device("cuda")
    tag = os.environ.get("CATENGINE_ARCH") or "default"
    report = {"arch": arch.arch_of(dev), "device_key": list(arch.device_key(dev)), "tokens": {},
              "top2": {}}
    for kind in KINDS:
        engine = Engine(model=str(workdir / f"{kind}-awq"), device="cuda", max_model_len=256, max_num_seqs=4,
                        kv_cache_memory_bytes=128 << 20)
        outs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True,
                                                       logprobs=2))
        report["tokens"][kind] = [list(o.token_ids) for o in outs]
        report["top2"][kind] = [[[list(t) for t in lp.top] for lp in o.logprobs] for o in outs]
        engine.check_integrity()
        del engine
        torch.cuda.empty_cache()
        ids = random_prompts(random.Random(2), 1, FORCED_TOKENS, VOCAB)[0]
        torch.save(catengine_logits(workdir / f"{kind}-fp16", ids, dev), workdir / f"logits-{kind}-{tag}.pt")
    (workdir / f"report-{tag}.json").write_text(json.dumps(report))


def _run_path(workdir: Path, arch: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "CATENGINE_ARCH"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    if arch:
        env["CATENGINE_ARCH"] = arch
    out = subprocess.run([sys.executable, __file__, str(workdir)], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, f"CATENGINE_ARCH={arch}: worker failed\n{out.stderr[-6000:]}"
    return json.loads((workdir / f"report-{arch or 'default'}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from catengine.tools.bench import Sizes
    from catengine.tools.correctness import correctness_specs
    from catengine.tools.random_checkpoint import write_random_checkpoint
    workdir = tmp_path_factory.mktemp("arch70")
    for kind, spec in correctness_specs(Sizes(), quick=False).items():
        spec = dict(spec, vocab_size=VOCAB)
        write_random_checkpoint(workdir / f"{kind}-awq", spec, quant="awq", group_size=128, device="cuda",
                                progress=False)
        write_random_checkpoint(workdir / f"{kind}-fp16", spec, quant=None, device="cuda", progress=False)
    return workdir, {"70": _run_path(workdir, "70"), "default": _run_path(workdir, None)}


def test_switch_reaches_the_subprocess(runs):
    _, reports = runs
    assert reports["70"]["arch"] == 70 and reports["70"]["device_key"] == ["sm70", 80]
    native = torch.cuda.get_device_capability()
    assert reports["default"]["arch"] == (70 if native[0] < 8 else 80 if native[0] < 9 else 90)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_tokens_equal_the_default_path(runs, kind):
    _, reports = runs
    got, want = reports["70"]["tokens"][kind], reports["default"]["tokens"][kind]
    assert [len(t) for t in got] == [MAX_TOKENS] * len(PROMPTS)
    flips = []
    for i, (g, w) in enumerate(zip(got, want)):
        if g == w:
            continue
        j = next(j for j, (a, b) in enumerate(zip(g, w)) if a != b)
        (best, lp_best), (second, lp_second) = reports["default"]["top2"][kind][i][j]
        assert {g[j], w[j]} == {best, second} and lp_best - lp_second < NEAR_TIE, (
            f"prompt {i} token {j}: CATENGINE_ARCH=70 chose {g[j]}, the default path {w[j]} with top two "
            f"{best} ({lp_best:.4f}) and {second} ({lp_second:.4f}): not a near-tie")
        flips.append(i)
    assert len(flips) <= 1, f"greedy tokens diverge in prompts {flips}: {got} vs {want}"


@pytest.mark.parametrize("kind", KINDS)
def test_teacher_forced_top1_vs_float32_transformers(runs, kind):
    from catengine.tools.bench_common import random_prompts
    from catengine.tools.correctness import _hf_class, compare_logits
    workdir, _ = runs
    ids = random_prompts(random.Random(2), 1, FORCED_TOKENS, VOCAB)[0]
    hf = _hf_class(kind == "moe").from_pretrained(workdir / f"{kind}-fp16", dtype=torch.float32).to("cuda").eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids], device="cuda")).logits[0].float().cpu()
    del hf
    got = compare_logits(ref, torch.load(workdir / f"logits-{kind}-70.pt"))
    default = compare_logits(ref, torch.load(workdir / f"logits-{kind}-default.pt"))
    print(f"{kind}: CATENGINE_ARCH=70 {got}; default path {default}")
    assert got["top1_agreement"] >= TARGET_TOP1, (got, default)


@pytest.mark.parametrize("case", [([300, 1, 77, 5, 128], 2, 2, 32, 32), ([1, 63, 200], 2, 2, 128, 128)],
                         ids=["dk32_ragged", "dk128_ragged"])
def test_gdn_chunk_on_the_sm70_row(case):
    """The chunked GDN prefill with the sm_70 row (its scan form, BV 32, 4 warps) against the twin, in fp16: the
    engine tests above run it in every linear-attention layer (dk = 128), and bench/NOTES.md reports the scan's
    BV 32 / 4-warp build wrong on the H200 at dk = 128 (relative difference 1.9-2.2; 0.85 on 2026-12-02 with this
    case, where the row's present BV 64 / 8 warps / 2 stages gave 5.6e-4): if the engine tests fail, this one says
    whether that is why. Bound: the fp16 tolerance of tests/kernels/gdn/test_gated_delta_rule.py (its docstring)."""
    from .kernels.gdn.test_gated_delta_rule import TOL, _case, _rel, _run
    from catengine.kernels.gdn import naive as ref
    from catengine.kernels.gdn import table as gdn_table
    lens, hk, r, dk, dv = case
    q, k, v, g, beta, ssm, qsl, slots, has = _case(lens, hk, r, dk, dv, torch.float16, torch.Generator().manual_seed(5),
                                                   has_p=0.5)
    ssm_ref = ssm.clone()
    o_ref = ref.chunk_gated_delta_rule(q, k, v, g, beta, ssm_ref, qsl, slots, has, dk ** -0.5)
    o, ssm_d = _run(gdn_table.TABLE[70], q, k, v, g, beta, ssm, qsl, slots, has, dk ** -0.5)
    written = [int(s) for s, n in zip(slots, lens) if n > 0]
    assert _rel(o, o_ref) < TOL[torch.float16]
    assert _rel(ssm_d[written], ssm_ref[written]) < TOL[torch.float16]


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
