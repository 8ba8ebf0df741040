"""The MTP head loads from mtp.* tensors and computes norm(layer0(fc(cat[norm_e(embed), norm_h(h)]))),
checked against transformers' own decoder layer and norms carrying the same weights."""
import pytest
import torch

from catengine.models import ModelConfig, model_class
from catengine.models.batch import BatchMetadata

from .helpers import build_hf_model


def mtp_weights(hf, seed):
    """Random mtp.* tensors shaped like a published checkpoint's (the full-attention layer 3 is the template)."""
    g = torch.Generator().manual_seed(seed)
    h = hf.config.hidden_size
    out = {f"mtp.{n}.weight": torch.randn(h, generator=g) * 0.1
           for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")}
    out["mtp.fc.weight"] = torch.randn(h, 2 * h, generator=g) / (2 * h) ** 0.5
    for name, p in hf.model.layers[3].state_dict().items():
        out[f"mtp.layers.0.{name}"] = torch.randn(p.shape, generator=g) * p.std().clamp_min(0.05)
    return out


@pytest.mark.parametrize("moe", [False, True])
def test_mtp_forward_matches_transformers_blocks(moe):
    hf = build_hf_model(moe=moe, seed=11)
    extra = mtp_weights(hf, 12)
    config = ModelConfig.from_hf(hf.config.to_dict())
    ours = model_class(config.architecture)(config, torch.float32, "cpu", with_mtp=True)
    ours.load_weights(list(hf.state_dict().items()) + list(extra.items()))

    T = 7
    g = torch.Generator().manual_seed(13)
    ids = torch.randint(0, config.vocab_size, (T,), generator=g)
    h_prev = torch.randn(T, config.hidden_size, generator=g)
    caches = ours.allocate_caches(8, 4, 2)
    batch = BatchMetadata.build([T], [T], [[0, 1]], 4, [0])
    got = ours.mtp_forward(ids, BatchMetadata.positions([T], [T]), h_prev, batch, caches)

    # oracle: transformers modules with the same weights
    layer = type(hf.model.layers[3])(hf.config, 3).float().eval()
    layer.load_state_dict({k[len("mtp.layers.0."):]: v for k, v in extra.items() if k.startswith("mtp.layers.0.")})
    norm_cls = type(hf.model.norm)
    norms = {}
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        norms[n] = norm_cls(config.hidden_size, eps=config.rms_norm_eps)
        norms[n].weight.data.copy_(extra[f"mtp.{n}.weight"])
    with torch.no_grad():
        e = norms["pre_fc_norm_embedding"](hf.model.embed_tokens(ids))
        x = torch.cat([e, norms["pre_fc_norm_hidden"](h_prev)], -1) @ extra["mtp.fc.weight"].t()
        pos = torch.arange(T)[None]
        cos_sin = hf.model.rotary_emb(x[None], pos)
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        y = layer(x[None], position_embeddings=cos_sin, attention_mask=mask, position_ids=pos)
        y = y[0] if isinstance(y, tuple) else y
        want = norms["norm"](y[0])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_model_without_mtp_rejects_mtp_forward():
    hf = build_hf_model(seed=1)
    config = ModelConfig.from_hf(hf.config.to_dict())
    ours = model_class(config.architecture)(config, torch.float32, "cpu")
    ours.load_weights(hf.state_dict().items())
    with pytest.raises(Exception, match="mtp"):
        ours.mtp_forward(torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                         torch.zeros(1, config.hidden_size), None, None)
