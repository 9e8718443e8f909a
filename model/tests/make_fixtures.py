"""Reference checkpoints and outputs for model_test (run with the venv's python).

    make_fixtures.py OUT_DIR                  tiny random Qwen2 / Qwen3 / Llama checkpoints + refs
    make_fixtures.py logits OUT_JSON IDS_JSON MODEL_DIR...
                                              transformers' logits of checkpoints we saved (round trip):
                                              {MODEL_DIR: [per-prompt logits]}

Each checkpoint OUT_DIR/<name>/ is save_pretrained output (fp32) and OUT_DIR/<name>/reference.json
holds transformers' answers: per-prompt logits, a batched greedy continuation (left padding)
with each token's log-prob, per-sequence teacher-forced log-probs, and the gradient norm of the
summed log-probs. Weights are random with non-trivial biases and norm scales so every tensor
matters.
"""
import json
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

VOCAB = 128
NEW_TOKENS = 20
PROMPTS = [[5, 17, 99, 3, 64, 12, 7], [101, 2, 33, 45, 8, 90, 11, 27, 60, 1, 77, 14]]
SEQUENCES = [[9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 126], [100, 50, 25, 12, 6]]

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, pad_token_id=None)

MODELS = {
    # Qwen2.5: q/k/v biases, untied, a non-default rope theta.
    "qwen2": (Qwen2ForCausalLM, Qwen2Config(**COMMON, rope_theta=1000000.0, tie_word_embeddings=False), None),
    # Qwen3: q/k norms, head_dim != hidden/heads, tied embeddings.
    "qwen3": (Qwen3ForCausalLM, Qwen3Config(**COMMON, head_dim=24, tie_word_embeddings=True), None),
    # Llama 3.1-style: llama3 rope scaling, attention and mlp biases, sharded on save.
    "llama": (LlamaForCausalLM, LlamaConfig(**COMMON, attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
                                            rope_scaling={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                          "original_max_position_embeddings": 32}),
              "20KB"),
}


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.15 * noise)


@torch.no_grad()
def single_logits(model, ids):
    return model(torch.tensor([ids])).logits[0]


@torch.no_grad()
def greedy(model, prompts):
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                         pad_token_id=0, eos_token_id=None, output_logits=True, return_dict_in_generate=True)
    new = out.sequences[:, width:]
    logprobs = torch.stack([torch.log_softmax(l.float(), -1) for l in out.logits], 1)  # [B, N, V]
    chosen = logprobs.gather(-1, new.unsqueeze(-1)).squeeze(-1)
    return new.tolist(), chosen.tolist()


def teacher_logprobs(model, seq):
    logits = model(torch.tensor([seq])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(seq[1:]).unsqueeze(-1)).squeeze(-1)


def grad_norm(model, sequences):
    model.zero_grad()
    total = sum(teacher_logprobs(model, s).sum() for s in sequences)
    total.backward()
    norms = [p.grad.norm() ** 2 for p in model.parameters() if p.grad is not None]
    return float(total), float(torch.stack(norms).sum().sqrt())


def make(out_dir, name, seed):
    cls, config, shard = MODELS[name]
    torch.manual_seed(seed)
    model = cls(config).float().eval()
    randomize(model, seed)
    path = os.path.join(out_dir, name)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(path, **kwargs)
    tokens, token_logprobs = greedy(model, PROMPTS)
    loss, norm = grad_norm(model, SEQUENCES)
    ref = {
        "prompts": PROMPTS,
        "logits": [single_logits(model, p).tolist() for p in PROMPTS],
        "greedy_tokens": tokens,
        "greedy_logprobs": token_logprobs,
        "sequences": SEQUENCES,
        "teacher_logprobs": [teacher_logprobs(model, s).tolist() for s in SEQUENCES],
        "logprob_sum": loss,
        "grad_norm": norm,
    }
    with open(os.path.join(path, "reference.json"), "w") as f:
        json.dump(ref, f)


def roundtrip_logits(out_json, ids_json, *model_dirs):
    from transformers import AutoModelForCausalLM
    with open(ids_json) as f:
        prompts = json.load(f)
    out = {}
    for d in model_dirs:
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        out[d] = [single_logits(model, p).tolist() for p in prompts]
    with open(out_json, "w") as f:
        json.dump(out, f)


def main():
    torch.set_num_threads(1)
    if sys.argv[1] == "logits":
        roundtrip_logits(*sys.argv[2:])
        return
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    for seed, name in enumerate(MODELS):
        make(out_dir, name, seed + 1)
    print("fixtures written to", out_dir)


if __name__ == "__main__":
    main()
