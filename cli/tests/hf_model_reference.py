"""transformers' answers for serve_model_test (run with the venv's python).

    hf_model_reference.py generate MODEL_DIR MAX_NEW PROMPT...
        loads MODEL_DIR with AutoModelForCausalLM + AutoTokenizer and prints JSON:
        {"raw": [{"prompt_ids", "token_ids", "text"}...]  greedy continuation of each prompt alone,
         "chat": {"prompt_ids", "token_ids", "text"}}      greedy reply to CHAT (apply_chat_template)
        Generation stops at generation_config.json's eos ids (the eos token is kept in token_ids);
        text is decoded with skip_special_tokens.
    hf_model_reference.py config MODEL_DIR
        {"parameters": count on the meta device, "model_type", "vocab_size", ..., "tokenizer_vocab"}
"""
import json
import sys

CHAT = [{"role": "system", "content": "You write CUDA kernels."},
        {"role": "user", "content": "Write a ReLU kernel."}]


def greedy(model, tokenizer, ids, max_new):
    import torch
    out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=max_new, do_sample=False)
    new = out[0, len(ids):].tolist()
    return {"prompt_ids": ids, "token_ids": new, "text": tokenizer.decode(new, skip_special_tokens=True)}


def generate(model_dir, max_new, prompts):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    with torch.no_grad():
        raw = [greedy(model, tokenizer, tokenizer.encode(p, add_special_tokens=False), max_new) for p in prompts]
        chat_ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
        if isinstance(chat_ids, dict) or hasattr(chat_ids, "keys"):  # transformers 5 may return a BatchEncoding
            chat_ids = chat_ids["input_ids"]
        chat = greedy(model, tokenizer, list(chat_ids), max_new)
    print(json.dumps({"raw": raw, "chat": chat}))


def config(model_dir):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    cfg = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    print(json.dumps({"parameters": sum(p.numel() for p in model.parameters()), "model_type": cfg.model_type,
                      "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
                      "num_hidden_layers": cfg.num_hidden_layers, "tie_word_embeddings": cfg.tie_word_embeddings,
                      "tokenizer_vocab": len(tokenizer), "eos_token_id": cfg.eos_token_id,
                      "chat": tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)}))


if __name__ == "__main__":
    if sys.argv[1] == "generate":
        generate(sys.argv[2], int(sys.argv[3]), sys.argv[4:])
    elif sys.argv[1] == "config":
        config(sys.argv[2])
    else:
        sys.exit(f"unknown command {sys.argv[1]}")
