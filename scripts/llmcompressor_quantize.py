"""One llm-compressor checkpoint of a float model, for ``scripts/llmcompressor_compare.py``.

    LLMC_PYTHON scripts/llmcompressor_quantize.py --model FLOAT_DIR --calib CALIB.json --recipe NAME --out DIR

Runs in an environment with llm-compressor (its pins differ from lowbit's and vLLM's:
llmcompressor 0.14.0.1 wants transformers<=5.17 and compressed-tensors 0.19.0), so it imports
neither lowbit nor vLLM. CALIB.json is ``{"input_ids": [[ids]...]}``: the very calibration windows
lowbit quantizes with, so both tools see the same tokens. Recipes (LM head left float, as vLLM's
CPU build needs): ``w8a8-rtn`` (INT8 channel weights, dynamic per-token INT8 activations),
``w8a8-sq-gptq`` (the same with SmoothQuant 0.8 and GPTQ: llm-compressor's int8 W8A8 example
recipe), ``w4a16-g64-rtn`` and ``w4a16-g64-gptq`` (INT4 symmetric groups of 64: 576 is no
multiple of the W4A16 preset's 128).
"""

from __future__ import annotations

import argparse
import json
import time

W4_G64 = {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                         "strategy": "group", "group_size": 64}}}


def recipe(name: str):
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from llmcompressor.modifiers.transform import SmoothQuantModifier

    head = ["lm_head"]
    return {
        "w8a8-rtn": lambda: [QuantizationModifier(targets="Linear", scheme="W8A8", ignore=head)],
        "w8a8-sq-gptq": lambda: [SmoothQuantModifier(smoothing_strength=0.8),
                                 GPTQModifier(targets="Linear", scheme="W8A8", ignore=head)],
        "w4a16-g64-rtn": lambda: [QuantizationModifier(config_groups=W4_G64, ignore=head)],
        "w4a16-g64-gptq": lambda: [GPTQModifier(config_groups=W4_G64, ignore=head)],
    }[name]()


RECIPES = ("w8a8-rtn", "w8a8-sq-gptq", "w4a16-g64-rtn", "w4a16-g64-gptq")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--calib", required=True)
    ap.add_argument("--recipe", required=True, choices=RECIPES)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = json.load(open(args.calib))["input_ids"]
    data = Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * len(r) for r in ids]})
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(args.model)
    t0 = time.perf_counter()
    oneshot(model=model, dataset=data, recipe=recipe(args.recipe), max_seq_length=len(ids[0]),
            num_calibration_samples=len(ids), shuffle_calibration_samples=False)
    seconds = time.perf_counter() - t0
    model.save_pretrained(args.out, save_compressed=True)
    tok.save_pretrained(args.out)
    print(json.dumps({"recipe": args.recipe, "quantize_s": seconds}))


if __name__ == "__main__":
    main()
