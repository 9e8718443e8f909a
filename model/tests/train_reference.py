"""Training references for train_test (run with the venv's python, after make_fixtures.py).

    train_reference.py refs FIXTURES OUT      per fixture (qwen2, qwen3, llama) in OUT/<name>/:
        full_step/       the checkpoint after one full fine-tuning step (transformers + torch AdamW)
        lora_init/       a peft adapter (r 4, alpha 8, all seven projections) whose B is random,
                         so gradients reach A
        lora_step/       that adapter after one peft training step
        reference.json   the batch, the hyper-parameters, and each step's loss and grad norm
    train_reference.py peft_logits OUT_JSON PROMPTS_JSON BASE_DIR:ADAPTER_DIR...
        logits of each prompt under PeftModel.from_pretrained(base, adapter): {ADAPTER_DIR: [...]}

One step = masked mean NLL over the batch's trained targets, backward, clip_grad_norm_ at
MAX_NORM, torch.optim.AdamW (single-tensor path); norm weights and biases get no weight decay.
"""
import json
import os
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

FAMILIES = ["qwen2", "qwen3", "llama"]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SEQUENCES = [[3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46], [2, 71, 82, 81, 82, 8, 45], [1, 41, 42, 13, 56, 23, 73, 9, 30]]
PROMPT_TARGETS = 3  # sequence 0's first targets are a "prompt": weight 0
HYPER = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-6, weight_decay=0.1, max_grad_norm=1.0, lora_r=4, lora_alpha=8)


def batch():
    width = max(map(len, SEQUENCES))
    ids = torch.tensor([s + [0] * (width - len(s)) for s in SEQUENCES])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in SEQUENCES])
    loss_mask = mask[:, 1:].clone().float()
    loss_mask[0, :PROMPT_TARGETS] = 0
    return ids, mask, loss_mask


def masked_nll(model, ids, mask, loss_mask):
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    w = loss_mask * mask[:, 1:]
    return -(lp * w).sum() / w.sum()


def one_step(model, named_params, out_dir):
    """Loss, backward, clip, AdamW; saves the model to out_dir; returns (loss, grad norm)."""
    ids, mask, loss_mask = batch()
    loss = masked_nll(model, ids, mask, loss_mask)
    loss.backward()
    params = [p for _, p in named_params]
    norm = torch.nn.utils.clip_grad_norm_(params, HYPER["max_grad_norm"])
    no_decay = lambda n: n.endswith("bias") or n.endswith("norm.weight")
    groups = [{"params": [p for n, p in named_params if not no_decay(n)], "weight_decay": HYPER["weight_decay"]},
              {"params": [p for n, p in named_params if no_decay(n)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=HYPER["lr"], betas=(HYPER["beta1"], HYPER["beta2"]), eps=HYPER["eps"],
                            foreach=False)
    opt.step()
    model.save_pretrained(out_dir)
    return float(loss), float(norm)


def load(fixture):
    return AutoModelForCausalLM.from_pretrained(fixture, dtype=torch.float32)


def full_reference(fixture, out):
    model = load(fixture)
    named = [(n, p) for n, p in model.named_parameters()]
    return one_step(model, named, os.path.join(out, "full_step"))


def lora_reference(fixture, out, seed):
    torch.manual_seed(seed)
    config = LoraConfig(r=HYPER["lora_r"], lora_alpha=HYPER["lora_alpha"], target_modules=TARGETS, lora_dropout=0.0,
                        task_type="CAUSAL_LM")
    model = get_peft_model(load(fixture), config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    model.save_pretrained(os.path.join(out, "lora_init"))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return one_step(model, named, os.path.join(out, "lora_step"))


def refs(fixtures, out_root):
    for seed, name in enumerate(FAMILIES):
        out = os.path.join(out_root, name)
        os.makedirs(out, exist_ok=True)
        fixture = os.path.join(fixtures, name)
        full_loss, full_norm = full_reference(fixture, out)
        lora_loss, lora_norm = lora_reference(fixture, out, 100 + seed)
        ids, mask, loss_mask = batch()
        ref = {"input_ids": ids.tolist(), "attention_mask": mask.tolist(), "loss_mask": loss_mask.tolist(),
               "hyper": HYPER, "full": {"loss": full_loss, "grad_norm": full_norm},
               "lora": {"loss": lora_loss, "grad_norm": lora_norm}}
        with open(os.path.join(out, "reference.json"), "w") as f:
            json.dump(ref, f)
    print("training references written to", out_root)


@torch.no_grad()
def peft_logits(out_json, prompts_json, *pairs):
    with open(prompts_json) as f:
        prompts = json.load(f)
    out = {}
    for pair in pairs:
        base, adapter = pair.split(":")
        model = PeftModel.from_pretrained(load(base), adapter).eval()
        out[adapter] = [model(torch.tensor([p])).logits[0].tolist() for p in prompts]
    with open(out_json, "w") as f:
        json.dump(out, f)


def main():
    torch.set_num_threads(1)
    if sys.argv[1] == "refs":
        refs(*sys.argv[2:])
    elif sys.argv[1] == "peft_logits":
        peft_logits(*sys.argv[2:])
    else:
        sys.exit(f"unknown command {sys.argv[1]}")


if __name__ == "__main__":
    main()
