#!/usr/bin/env python
"""Average the weights of the last N checkpoints of a run (fairseq's checkpoint averaging) into a saved model.

    python scripts/average_checkpoints.py --run runs/multi30k/talk --last 5 --output runs/multi30k/talk/averaged

The output folder is the run's model/ (config, code, tokenizer, generation settings) with the averaged weights, and
a model card naming the checkpoints averaged, with what the run's card was built from (its languages, licence,
datasets, base model, repository and name, as the run's eval_results.json records them; not its scores, which are
another model's).
"""

import argparse
import json
from pathlib import Path

from huggingface_hub import ModelCard
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

import talk_hf  # noqa: F401
from talk_hf.training.loop import average_checkpoints, scheduled_checkpoints
from talk_hf.training.model_card import write_model_card
from talk_hf.training.run import card_arguments


def card_metadata(model_dir):
    """The languages, licence, datasets and base model of the run's model card (none without one)."""
    path = Path(model_dir) / "README.md"
    if not path.is_file():
        return {}
    data = ModelCard.load(path).data
    return {"languages": data.language or (), "license": data.license, "datasets": data.datasets or (),
            "base_model": data.base_model}


def run_card(model_dir):
    """The keyword arguments the run's model card was built from (talk_hf.training.run.card_arguments of its
    eval_results.json: languages, licence, datasets, base model, repository ...), over what its card's metadata names
    (card_metadata) for a run whose results record no card."""
    path = Path(model_dir) / "eval_results.json"
    results = json.loads(path.read_text()) if path.is_file() else {}
    return {**card_metadata(model_dir), **card_arguments(results)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a run folder of scripts/train.py (has model/ and checkpoints/)")
    parser.add_argument("--last", type=int, default=5, help="how many of the latest checkpoints to average")
    parser.add_argument("--output", required=True, help="folder for the averaged model")
    args = parser.parse_args(argv)
    if args.last < 1:
        parser.error(f"--last must be >= 1, got {args.last}")
    found = scheduled_checkpoints(args.run)  # as the run averages them: a resumed run's resume points left out
    if len(found) < args.last:
        raise SystemExit(f"{args.run} has {len(found)} checkpoints, fewer than --last {args.last}")
    model_dir = f"{args.run}/model"
    if not Path(model_dir, "config.json").is_file():
        raise SystemExit(f"{args.run} has no model/ folder (a run saves it when it ends): its config, code and "
                         "tokenizer are what the averaged weights are saved with")
    card = run_card(model_dir)  # read first: a card that does not parse stops the script before it writes
    config = AutoConfig.from_pretrained(model_dir)
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    model = auto.from_pretrained(model_dir)
    missing, unexpected = model.load_state_dict(average_checkpoints(found[-args.last :]), strict=False)
    if unexpected or [k for k in missing if k not in model.all_tied_weights_keys]:
        raise SystemExit(f"checkpoint weights do not match the model: missing {missing}, unexpected {unexpected}")
    model.save_pretrained(args.output)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(args.output)
    names = [p.name for p in found[-args.last :]]
    write_model_card(args.output, model, training_args={"averaged_checkpoints": " ".join(names)}, **card)
    print(f"averaged {names} into {args.output}")
    return args.output


if __name__ == "__main__":
    main()
