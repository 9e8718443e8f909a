"""transformers' view of a kz sft checkpoint, for sft_train_test (run with the venv's python).

    hf_sft.py MODEL_DIR IN_JSON OUT_JSON
        IN_JSON: {"messages": [{"role", "content"}...], "ids": [...], "positions": [...]}
        loads MODEL_DIR with AutoModelForCausalLM and AutoTokenizer and writes OUT_JSON:
        {"chat_ids": apply_chat_template(messages, add_generation_prompt=True) token ids,
         "logits": the float32 logits of `ids` at each of `positions` ([len(positions), vocab])}
"""
import json
import sys


def main(model_dir, in_path, out_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    request = json.load(open(in_path))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chat_ids = tokenizer.apply_chat_template(request["messages"], add_generation_prompt=True, tokenize=True)
    if hasattr(chat_ids, "keys"):  # transformers 5 may return a BatchEncoding
        chat_ids = chat_ids["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([request["ids"]])).logits[0]
    json.dump({"chat_ids": list(chat_ids), "logits": logits[request["positions"]].tolist()}, open(out_path, "w"))


if __name__ == "__main__":
    main(*sys.argv[1:4])
