#!/usr/bin/env python
"""Average the weights of the last N checkpoints of a run (fairseq's checkpoint averaging) into a saved model.

    python scripts/average_checkpoints.py --run runs/multi30k/talk --last 5 --output runs/multi30k/talk/averaged
"""

import argparse

from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

import talk_hf  # noqa: F401
from talk_hf.training.loop import average_checkpoints, checkpoints


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a run folder of scripts/train.py (has model/ and checkpoints/)")
    parser.add_argument("--last", type=int, default=5, help="how many of the latest checkpoints to average")
    parser.add_argument("--output", required=True, help="folder for the averaged model")
    args = parser.parse_args(argv)
    if args.last < 1:
        parser.error(f"--last must be >= 1, got {args.last}")
    found = checkpoints(args.run)
    if len(found) < args.last:
        raise SystemExit(f"{args.run} has {len(found)} checkpoints, fewer than --last {args.last}")
    model_dir = f"{args.run}/model"
    config = AutoConfig.from_pretrained(model_dir)
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    model = auto.from_pretrained(model_dir)
    missing, unexpected = model.load_state_dict(average_checkpoints(found[-args.last :]), strict=False)
    if unexpected or [k for k in missing if k not in model.all_tied_weights_keys]:
        raise SystemExit(f"checkpoint weights do not match the model: missing {missing}, unexpected {unexpected}")
    model.save_pretrained(args.output)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(args.output)
    print(f"averaged {[p.name for p in found[-args.last:]]} into {args.output}")
    return args.output


if __name__ == "__main__":
    main()
